"""Overtake PySpark runtime: pipelines as Spark barrier stages with aligned and unaligned checkpoints."""

from spark_plugin.config import NetworkConfig
from spark_plugin.pipeline import KeyedStream, Pipeline, PipelineError, Stream
from spark_plugin.sinks import CollectSink, DiscardSink, Sink
from spark_plugin.sources import SequenceSource, Source

__all__ = [
    "CollectSink",
    "DiscardSink",
    "KeyedStream",
    "NetworkConfig",
    "Pipeline",
    "PipelineError",
    "SequenceSource",
    "Sink",
    "Source",
    "Stream",
]
