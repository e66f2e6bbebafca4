"""Connectors: file sources (JSON lines, Parquet) and sinks committed on checkpoints, PostgreSQL, Redis Streams."""

from spark_plugin.connectors.files import FileSink, JsonLinesSource, ParquetSource

__all__ = ["FileSink", "JsonLinesSource", "ParquetSource"]
