"""Redis Streams source: one stream per split, entry ids as positions.

The runtime assigns streams to source subtasks (a partitioned source); each record is ``(stream, entry_id,
fields)``. Reads never block the subtask loop (``XREAD`` without ``BLOCK``).
"""

from __future__ import annotations

from typing import Any

from spark_plugin.connectors.base import PartitionedSource, SplitReader


class RedisStreamSource(PartitionedSource):
    """Reads ``streams`` from ``url``; with ``stop_at_end`` a stream ends when it has no more entries."""

    def __init__(self, url: str, streams: list[str], stop_at_end: bool = False, idle_wait: float = 0.05) -> None:
        if not streams:
            raise ValueError("RedisStreamSource needs at least one stream name")
        self.url = url
        self.streams = list(streams)
        self.stop_at_end = stop_at_end
        self.idle_wait = idle_wait
        self._redis = None

    def open(self, subtask_index: int, parallelism: int) -> None:
        import redis

        self._redis = redis.Redis.from_url(self.url, decode_responses=True)
        super().open(subtask_index, parallelism)

    def list_splits(self) -> list[str]:
        return list(self.streams)

    def build_split_reader(self, split: str, position: Any | None) -> SplitReader:
        return _StreamReader(self, split, position or "0-0")

    def legacy_offsets(self, offsets: dict[str, Any], subtask_index: int, parallelism: int) -> dict[str, Any]:
        """``{"ids": {stream: last entry id read}}``."""
        return {"split_positions": dict(offsets.get("ids") or {})}

    def close(self) -> Any:
        super().close()
        if self._redis is not None:
            self._redis.close()
            self._redis = None
        return None


class _StreamReader(SplitReader):
    """One stream, after entry ``last_id``."""

    def __init__(self, source: RedisStreamSource, stream: str, last_id: str) -> None:
        self.source, self.stream, self.last_id = source, stream, last_id

    def poll(self, max_records: int) -> list[Any] | None:
        assert self.source._redis is not None
        reply = self.source._redis.xread({self.stream: self.last_id}, count=max_records)
        out: list[Any] = []
        for stream, entries in reply or []:
            for entry_id, fields in entries:
                out.append((stream, entry_id, fields))
                self.last_id = entry_id
        if not out and self.source.stop_at_end:
            return None
        return out

    def position(self) -> Any:
        return self.last_id

    def wait_hint(self) -> float | None:
        return self.source.idle_wait
