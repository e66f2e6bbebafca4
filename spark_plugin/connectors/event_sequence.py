"""``EventSequenceSource``: generated timestamped events over several partitions, out of order within a bound, with
skewed keys and partition speeds, optional late events and idle partitions (event-time tests, benchmarks, demos)."""

from __future__ import annotations

import bisect
import time
from typing import Any

from spark_plugin.connectors.base import PartitionedSource, SplitReader
from spark_plugin.connectors.sequence import _uniform


class EventSequenceSource(PartitionedSource):
    """Emits ``(key, timestamp, partition, n)``: record ``n`` of partition ``q``.

    There are ``partitions`` partitions, the source's splits (split ``"q"`` for partition ``q``, so subtask ``i`` of
    ``p`` reads those with ``q % p == i``), read in turn a batch at a time.
    Partition ``q``'s event time advances ``interval_ms * speeds[q]`` per record from ``start_ms``, minus a jitter
    of up to ``disorder_ms`` (so a watermark strategy with that out-of-orderness never sees a late record), except
    every ``late_every``-th record, which is ``late_ms`` to ``2 * late_ms`` older. Keys follow a Zipf law of exponent ``skew`` over
    ``keys`` keys. ``count`` bounds the records per partition (None: unbounded); ``rate`` is records per second per
    partition (None: as fast as the output takes them). Partitions in ``idle`` never send anything.
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

    # ------------------------------------------------------------------ PartitionedSource

    def list_splits(self) -> list[str]:
        return [str(q) for q in range(self.num_partitions)]

    def build_split_reader(self, split: str, position: Any | None) -> SplitReader:
        return _PartitionReader(self, int(split), int(position or 0))

    def legacy_offsets(self, offsets: dict[str, Any], subtask_index: int, parallelism: int) -> dict[str, Any]:
        """``{"next": {q: n}}``: the next record of each partition the subtask read."""
        return {"split_positions": {str(q): int(n) for q, n in (offsets.get("next") or {}).items()}}

    @staticmethod
    def reached(offsets: dict[str, Any]) -> dict[int, int]:
        """The next record of each partition, by partition, from a subtask's offsets (an ended one is left out)."""
        positions = offsets.get("split_positions") or {}
        return {int(q): int(n or 0) for q, n in positions.items()}


class _PartitionReader(SplitReader):
    """Partition ``q`` of an :class:`EventSequenceSource` from record ``n`` on."""

    def __init__(self, source: EventSequenceSource, q: int, n: int) -> None:
        self.source, self.q, self.n = source, q, n
        self._started, self._from = time.monotonic(), n

    def poll(self, max_records: int) -> list[Any] | None:
        src = self.source
        if src.count is not None and (self.n >= src.count or self.q in src.idle):
            return None
        if self.q in src.idle:
            return []
        n = max_records if src.count is None else min(max_records, src.count - self.n)
        if src.rate is not None:
            n = min(n, max(int(src.rate * (time.monotonic() - self._started)) - (self.n - self._from), 0))
        out = [src.record(self.q, k) for k in range(self.n, self.n + n)]
        self.n += n
        return out

    def position(self) -> Any:
        return self.n

    def wait_hint(self) -> float | None:
        rate = self.source.rate
        return None if rate is None else 1.0 / rate
