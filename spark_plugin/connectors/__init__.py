"""Connectors: the ``PartitionedSource``/``SplitReader``, ``Source`` and ``Sink`` contracts (``base``), the runtime's
reading of splits (``split_reading``), and their implementations.

Sources: ``SequenceSource`` and ``EventSequenceSource`` (generated), ``JsonLinesSource`` and ``ParquetSource`` (files), ``RedisStreamSource``,
``KafkaSource`` (partitions as splits, offsets in the checkpoint).
Sinks: ``CollectSink`` and ``DiscardSink`` (tests), ``FileSink``, ``ParquetSink``, ``PostgresSink`` and ``KafkaSink`` (committed exactly
once on checkpoints).
"""

from spark_plugin.connectors.base import PartitionedSource, Sink, Source, SplitReader
from spark_plugin.connectors.collect import CollectSink, DiscardSink
from spark_plugin.connectors.event_sequence import EventSequenceSource
from spark_plugin.connectors.files import FileSink, JsonLinesSource, ParquetSource
from spark_plugin.connectors.kafka import KafkaSink
from spark_plugin.connectors.kafka_source import KafkaRecord, KafkaSource
from spark_plugin.connectors.parquet_sink import ParquetSink
from spark_plugin.connectors.postgres import PostgresSink
from spark_plugin.connectors.redis_streams import RedisStreamSource
from spark_plugin.connectors.sequence import SequenceSource

__all__ = [
    "CollectSink",
    "DiscardSink",
    "EventSequenceSource",
    "FileSink",
    "JsonLinesSource",
    "KafkaRecord",
    "KafkaSink",
    "KafkaSource",
    "ParquetSink",
    "ParquetSource",
    "PartitionedSource",
    "PostgresSink",
    "RedisStreamSource",
    "SequenceSource",
    "Sink",
    "Source",
    "SplitReader",
]
