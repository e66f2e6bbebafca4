"""Overtake's PySpark runtime: pipelines run as Spark barrier stages with aligned and unaligned checkpoints.

    from spark_plugin import CollectSink, Pipeline, SequenceSource

The folders follow where code runs: ``api`` describes a pipeline, ``plan`` is the data the driver hands the tasks,
``driver`` runs the stage and restarts it, ``task`` is what runs in a Spark task, ``network`` moves buffers and
barriers between subtasks, ``connectors`` holds the source/sink contracts and their implementations, ``listener``
reports Structured Streaming queries, and ``testing`` runs pipelines without Spark.
"""

from contract.models import AfterAttempt, CheckpointConfig
from spark_plugin.api.errors import PipelineError
from spark_plugin.api.pipeline import BatchStream, KeyedBatchStream, KeyedStream, Stream
from spark_plugin.api.timers import KeyedProcessFunction
from spark_plugin.api.watermarks import WatermarkStrategy
from spark_plugin.api.windows import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
)
from spark_plugin.connectors import (
    CollectSink,
    DiscardSink,
    KafkaRecord,
    KafkaSink,
    KafkaSource,
    ParquetSink,
    ParquetSource,
    SequenceSource,
    Sink,
    Source,
)
from spark_plugin.driver.autoscale import ScaleOnBackpressure
from spark_plugin.driver.restart import ExponentialBackoff, FixedDelay, NoRestart, RestartStrategy
from spark_plugin.driver.run import RunFailed, RunResult
from spark_plugin.driver.scaling import FitToSlots
from spark_plugin.driver.supervisor import RestartsExhausted, SupervisedResult, Supervisor
from spark_plugin.network.config import NetworkConfig
from spark_plugin.pipeline import Pipeline

__all__ = [
    "AfterAttempt",
    "BatchStream",
    "CheckpointConfig",
    "CollectSink",
    "DiscardSink",
    "EventTimeSessionWindows",
    "ExponentialBackoff",
    "FitToSlots",
    "FixedDelay",
    "KafkaRecord",
    "KafkaSink",
    "KafkaSource",
    "KeyedBatchStream",
    "KeyedProcessFunction",
    "KeyedStream",
    "NetworkConfig",
    "NoRestart",
    "ParquetSink",
    "ParquetSource",
    "Pipeline",
    "PipelineError",
    "RestartStrategy",
    "RestartsExhausted",
    "RunFailed",
    "RunResult",
    "ScaleOnBackpressure",
    "SequenceSource",
    "Sink",
    "SlidingEventTimeWindows",
    "Source",
    "Stream",
    "SupervisedResult",
    "Supervisor",
    "TimeWindow",
    "TumblingEventTimeWindows",
    "WatermarkStrategy",
]
