"""Connectors: file sources (JSON lines, Parquet) and sinks committed on checkpoints, PostgreSQL, Redis Streams."""

from spark_plugin.connectors.files import FileSink, JsonLinesSource, ParquetSource
from spark_plugin.connectors.postgres import PostgresSink
from spark_plugin.connectors.redis_streams import RedisStreamSource

__all__ = ["FileSink", "JsonLinesSource", "ParquetSource", "PostgresSink", "RedisStreamSource"]
