"""Connectors: the ``Source``/``Sink`` contracts (``base``) and their implementations.

Sources: ``SequenceSource`` and ``EventSequenceSource`` (generated), ``JsonLinesSource`` and ``ParquetSource`` (files), ``RedisStreamSource``.
Sinks: ``CollectSink`` and ``DiscardSink`` (tests), ``FileSink`` and ``PostgresSink`` (committed exactly once on
checkpoints).
"""

from spark_plugin.connectors.base import Sink, Source
from spark_plugin.connectors.collect import CollectSink, DiscardSink
from spark_plugin.connectors.event_sequence import EventSequenceSource
from spark_plugin.connectors.files import FileSink, JsonLinesSource, ParquetSource
from spark_plugin.connectors.postgres import PostgresSink
from spark_plugin.connectors.redis_streams import RedisStreamSource
from spark_plugin.connectors.sequence import SequenceSource

__all__ = [
    "CollectSink",
    "DiscardSink",
    "EventSequenceSource",
    "FileSink",
    "JsonLinesSource",
    "ParquetSource",
    "PostgresSink",
    "RedisStreamSource",
    "SequenceSource",
    "Sink",
    "Source",
]
