"""``EventSequenceSource``: generated timestamped events over several partitions, out of order within a bound, with
skewed keys and partition speeds, optional late events and idle partitions (event-time tests, benchmarks, demos)."""

from __future__ import annotations

import bisect
import time
from typing import Any

from spark_plugin.connectors.base import Source
from spark_plugin.connectors.sequence import _uniform


class EventSequenceSource(Source):
    """Emits ``(key, timestamp, partition, n)``: record ``n`` of partition ``q``.

    There are ``partitions`` partitions; subtask ``i`` of ``p`` reads those with ``q % p == i`` and takes their
    records in turn (always the partition with the fewest emitted next, so the order depends only on the offsets).
    Partition ``q``'s event time advances ``interval_ms * speeds[q]`` per record from ``start_ms``, minus a jitter
    of up to ``disorder_ms`` (so a watermark strategy with that out-of-orderness never sees a late record), except
    every ``late_every``-th record, which is ``late_ms`` to ``2 * late_ms`` older. Keys follow a Zipf law of exponent ``skew`` over
    ``keys`` keys. ``count`` bounds the records per partition (None: unbounded); ``rate`` is records per second per
    subtask (None: as fast as the output takes them). Partitions in ``idle`` never send anything.
    Everything depends only on ``(q, n)``, so a replay is identical.
    """

    def __init__(
        self,
        count: int | None = None,
        partitions: int = 4,
        keys: int = 100,
        skew: float = 1.0,
        interval_ms: int = 10,
        speeds: list[float] | None = None,
        disorder_ms: int = 0,
        late_every: int = 0,
        late_ms: int = 0,
        idle: tuple[int, ...] | list[int] = (),
        start_ms: int = 0,
        rate: float | None = None,
    ) -> None:
        if partitions < 1:
            raise ValueError(f"partitions {partitions} must be at least 1")
        if speeds is not None and len(speeds) != partitions:
            raise ValueError(f"speeds has {len(speeds)} entries for {partitions} partitions")
        if keys < 1 or skew < 0 or disorder_ms < 0 or late_every < 0 or interval_ms < 0:
            raise ValueError("keys must be positive; skew, disorder_ms, late_every and interval_ms not negative")
        if rate is not None and rate <= 0:
            raise ValueError(f"rate {rate} must be positive (records per second per subtask) or None")
        self.count = count
        self.num_partitions = partitions
        self.keys = keys
        self.skew = skew
        self.interval_ms = interval_ms
        self.speeds = list(speeds) if speeds is not None else [1.0] * partitions
        self.disorder_ms = disorder_ms
        self.late_every = late_every
        self.late_ms = late_ms
        self.idle = frozenset(idle)
        self.start_ms = start_ms
        self.rate = rate
        self.next: dict[int, int] = {}
        weights = [1.0 / ((k + 1) ** skew) for k in range(keys)]
        total, acc, self._cdf = sum(weights), 0.0, []
        for w in weights:
            acc += w / total
            self._cdf.append(acc)
        self._cdf[-1] = 1.0

    # ------------------------------------------------------------------ the records, as a function of (q, n)

    def record(self, q: int, n: int) -> tuple[int, int, int, int]:
        seed = q * 1_000_003 + n
        key = bisect.bisect_right(self._cdf, _uniform(seed))
        ts = self.start_ms + int(n * self.interval_ms * self.speeds[q])
        ts -= int(_uniform(seed + 7_777_777_777) * (self.disorder_ms + 1)) if self.disorder_ms else 0
        if self.late_every and n % self.late_every == self.late_every - 1:
            ts -= self.late_ms + int(_uniform(seed + 3_333_333_333) * self.late_ms)
        return (key, ts, q, n)

    def all_records(self) -> list[tuple[int, int, int, int]]:
        """Every record of every partition (a bounded source), for reference results."""
        if self.count is None:
            raise ValueError("an unbounded source has no list of all its records")
        return [self.record(q, n) for q in range(self.num_partitions) if q not in self.idle for n in range(self.count)]

    # ------------------------------------------------------------------ Source

    def open(self, subtask_index: int, parallelism: int) -> None:
        super().open(subtask_index, parallelism)
        self._mine = [q for q in range(self.num_partitions) if q % parallelism == subtask_index]
        for q in self._mine:
            self.next.setdefault(q, 0)
        self._started = time.monotonic()
        self._emitted_at_start = sum(self.next.values())

    def partitions(self) -> list[Any]:
        return list(self._mine)

    def partition_of(self, record: Any) -> Any:
        return record[2]

    def _live(self) -> list[int]:
        return [q for q in self._mine if q not in self.idle and (self.count is None or self.next[q] < self.count)]

    def poll(self, max_records: int) -> list[Any] | None:
        live = self._live()
        if not live:
            return None if self.count is not None else []
        n = max_records
        if self.rate is not None:
            emitted = sum(self.next.values()) - self._emitted_at_start
            n = min(n, max(int(self.rate * (time.monotonic() - self._started)) - emitted, 0))
        out = []
        for _ in range(n):
            q = min(live, key=lambda p: (self.next[p], p))
            out.append(self.record(q, self.next[q]))
            self.next[q] += 1
            if self.count is not None and self.next[q] >= self.count:
                live.remove(q)
                if not live:
                    break
        return out

    def wait_hint(self) -> float | None:
        return None if self.rate is None else 1.0 / self.rate

    def offsets(self) -> dict[str, Any]:
        return {"next": {str(q): n for q, n in self.next.items()}}

    def seek(self, offsets: dict[str, Any]) -> None:
        for q, n in (offsets.get("next") or {}).items():
            self.next[int(q)] = int(n)
        self._started = time.monotonic()
        self._emitted_at_start = sum(self.next.values())

    def restore_positions(self, positions: list[dict[str, Any]]) -> None:
        """At another parallelism: the partitions are the splits; each of this subtask's continues where the
        checkpoint left it."""
        merged: dict[int, int] = {}
        for offsets in positions:
            merged.update({int(q): int(n) for q, n in (offsets.get("next") or {}).items()})
        self.next = {q: merged.get(q, 0) for q in self._mine}
        self._started = time.monotonic()
        self._emitted_at_start = sum(self.next.values())
