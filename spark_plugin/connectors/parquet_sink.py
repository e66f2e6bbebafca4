"""Parquet file sink: record batches (or row dicts) into Parquet files, committed exactly once on checkpoints.

The file protocol is :class:`~spark_plugin.connectors.files.FileSink`'s: rows go to an in-progress file, a snapshot
closes it into ``.pending`` under the checkpoint's id, and the checkpoint's completion renames it into the
directory as ``part-<job>-<subtask>-<checkpoint>.parquet``; a restore commits the restored checkpoint's files and
withdraws later ones. Each file has the schema of the first batch written into it; a later batch of another schema
is cast to it, or fails the sink naming both schemas.
"""

from __future__ import annotations

from typing import Any

from spark_plugin.connectors.files import FileSink


class ParquetSink(FileSink):
    """Writes ``pyarrow.RecordBatch`` records (a batch stream) or row dicts (a record stream) to Parquet files in
    ``directory``; ``compression`` is Parquet's (``"zstd"``, ``"snappy"``, ``"none"``...)."""

    suffix = ".parquet"

    def __init__(self, directory: str, compression: str = "zstd") -> None:
        super().__init__(directory)
        self.compression = compression
        self._rows: list[dict] = []

    def write(self, record: Any) -> None:
        import pyarrow as pa

        if isinstance(record, pa.RecordBatch):
            self._flush_rows()
            self._write_batch(record)
        elif isinstance(record, dict):
            self._rows.append(record)
            if len(self._rows) >= 1024:
                self._flush_rows()
        else:
            raise TypeError(f"ParquetSink writes pyarrow.RecordBatch records or row dicts, not {type(record).__name__}")

    def _flush_rows(self) -> None:
        if self._rows:
            import pyarrow as pa

            rows, self._rows = self._rows, []
            self._write_batch(pa.RecordBatch.from_pylist(rows))

    def _write_batch(self, batch: Any) -> None:
        import pyarrow.parquet as pq

        if self._handle is None:
            self._handle = pq.ParquetWriter(str(self._inprogress()), batch.schema, compression=self.compression)
            self._schema = batch.schema
        schema = self._schema
        if not batch.schema.equals(schema):
            try:
                batch = batch.cast(schema)
            except Exception as e:  # noqa: BLE001 - reported with both schemas
                raise TypeError(f"ParquetSink: a batch of schema {batch.schema} cannot go into a file of schema "
                                f"{schema}: {e}") from e
        self._handle.write_batch(batch)
        self._count += batch.num_rows

    def snapshot(self, checkpoint_id: int) -> Any:
        self._flush_rows()
        return super().snapshot(checkpoint_id)

    def uncommitted(self) -> bool:
        return bool(self._rows) or super().uncommitted()

    def close(self) -> Any:
        self._rows = []  # rows after the last checkpoint are not committed (as FileSink's unsnapshotted lines)
        return super().close()
