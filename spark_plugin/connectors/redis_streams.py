"""Redis Streams source: one stream per partition, entry ids as offsets.

Streams are assigned to source subtasks round robin (stream ``k`` to subtask ``k % parallelism``); each record
is ``(stream, entry_id, fields)``. Reads never block the subtask loop (``XREAD`` without ``BLOCK``).
"""

from __future__ import annotations

from typing import Any

from spark_plugin.connectors.base import Source


class RedisStreamSource(Source):
    """Reads ``streams`` from ``url``; with ``stop_at_end`` the source ends when its streams have no more entries."""

    def __init__(self, url: str, streams: list[str], stop_at_end: bool = False, idle_wait: float = 0.05) -> None:
        if not streams:
            raise ValueError("RedisStreamSource needs at least one stream name")
        self.url = url
        self.streams = list(streams)
        self.stop_at_end = stop_at_end
        self.idle_wait = idle_wait
        self.last_ids: dict[str, str] = {}
        self._redis = None

    def open(self, subtask_index: int, parallelism: int) -> None:
        import redis

        super().open(subtask_index, parallelism)
        self._redis = redis.Redis.from_url(self.url, decode_responses=True)
        mine = self.streams[subtask_index::parallelism]
        self.last_ids = {s: self.last_ids.get(s, "0-0") for s in mine}

    def poll(self, max_records: int) -> list[Any] | None:
        if not self.last_ids:
            return None
        assert self._redis is not None
        reply = self._redis.xread(dict(self.last_ids), count=max_records)
        out: list[Any] = []
        for stream, entries in reply or []:
            for entry_id, fields in entries:
                out.append((stream, entry_id, fields))
                self.last_ids[stream] = entry_id
        if not out and self.stop_at_end:
            return None
        return out

    def wait_hint(self) -> float | None:
        return self.idle_wait

    def offsets(self) -> dict[str, Any]:
        return {"ids": dict(self.last_ids)}

    def seek(self, offsets: dict[str, Any]) -> None:
        for stream, entry_id in offsets.get("ids", {}).items():
            if stream in self.last_ids:  # only the streams this subtask reads
                self.last_ids[stream] = entry_id

    def restore_positions(self, positions: list[dict[str, Any]]) -> None:
        """Each stream is a split: take the streams this subtask reads now, each after its last entry read."""
        self.seek({"ids": {s: i for offsets in positions for s, i in offsets.get("ids", {}).items()}})

    def close(self) -> Any:
        if self._redis is not None:
            self._redis.close()
            self._redis = None
        return None
