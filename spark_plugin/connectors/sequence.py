"""``SequenceSource``: a generated source of ``(key, seq)`` records with offsets, a rate and key skew."""

from __future__ import annotations

import bisect
import time
from typing import Any

from spark_plugin.connectors.base import PartitionedSource, SplitReader


def _uniform(seq: int) -> float:
    """A deterministic pseudo-random number in [0, 1) for sequence number ``seq`` (splitmix64)."""
    z = (seq + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z ^= z >> 31
    return (z >> 11) / float(1 << 53)


class SequenceSource(PartitionedSource):
    """Emits ``(key, seq)`` records from interleaved splits: of ``n`` splits, split ``s`` emits seq ``s, s+n, s+2n,
    ...``. A job's first run has one split per source subtask (split ``s`` of ``n`` is named ``"n:s"``); the splits
    stay when the source is rescaled (the runtime moves them whole), so every seq is emitted exactly once and in
    order within its split.

    ``count`` bounds the total over all splits (None: unbounded), ``rate`` is records per second per split (None: as
    fast as the output takes them), ``keys`` the number of distinct keys and ``skew`` the Zipf exponent of the key
    distribution (0: uniform). A record's key depends only on its seq, so a replay is identical.
    ``payload`` adds a string of that many bytes to each record: ``(key, seq, payload)``.
    """

    def __init__(
        self,
        count: int | None = None,
        rate: float | None = None,
        keys: int = 100,
        skew: float = 0.0,
        payload: int = 0,
    ) -> None:
        if count is not None and count < 0:
            raise ValueError(f"count {count} must not be negative")
        if rate is not None and rate <= 0:
            raise ValueError(f"rate {rate} must be positive (records per second per split) or None")
        if keys < 1:
            raise ValueError(f"keys {keys} must be at least 1")
        if skew < 0:
            raise ValueError(f"skew {skew} must not be negative")
        self.count = count
        self.rate = rate
        self.keys = keys
        self.skew = skew
        self.payload = payload

    def open(self, subtask_index: int, parallelism: int) -> None:
        weights = [1.0 / ((k + 1) ** self.skew) for k in range(self.keys)]
        total = sum(weights)
        acc = 0.0
        self._cdf = []
        for w in weights:
            acc += w / total
            self._cdf.append(acc)
        self._cdf[-1] = 1.0
        self._pad = "x" * self.payload
        super().open(subtask_index, parallelism)

    def key_of(self, seq: int) -> int:
        return bisect.bisect_right(self._cdf, _uniform(seq))

    def record(self, seq: int) -> tuple:
        return (self.key_of(seq), seq, self._pad) if self.payload else (self.key_of(seq), seq)

    def split_limit(self, split: int, splits: int) -> int | None:
        """Records split ``split`` of ``splits`` emits in all (None: unbounded)."""
        if self.count is None:
            return None
        return (self.count - split + splits - 1) // splits if self.count > split else 0

    @property
    def emitted(self) -> int:
        """Records emitted so far of the splits this subtask reads."""
        return sum(self.emitted_per_split(self.offsets()).values())

    # ------------------------------------------------------------------ PartitionedSource

    def list_splits(self) -> list[str]:
        """One split per subtask of the job's first run: as many as the restored checkpoint had, if any."""
        n = int(self.restored_splits[0].split(":")[0]) if self.restored_splits else self.parallelism
        return [f"{n}:{s}" for s in range(n)]

    def build_split_reader(self, split: str, position: Any | None) -> SplitReader:
        n, s = (int(x) for x in split.split(":"))
        return _SequenceSplitReader(self, s, n, int(position or 0))

    def legacy_offsets(self, offsets: dict[str, Any], subtask_index: int, parallelism: int) -> dict[str, Any]:
        """``{"splits": n, "positions": {s: emitted}}``, or the first version's ``{"emitted": k}`` (one split per
        subtask)."""
        if "positions" in offsets:
            n = int(offsets["splits"])
            return {"split_positions": {f"{n}:{s}": int(k) for s, k in offsets["positions"].items()}}
        return {"split_positions": {f"{parallelism}:{subtask_index}": int(offsets.get("emitted", 0))}}

    @staticmethod
    def emitted_per_split(offsets: dict[str, Any]) -> dict[tuple[int, int], int]:
        """Records emitted of each split ``(s, n)`` (split ``s`` of ``n``: seqs ``s + k * n``), from a subtask's
        offsets."""
        out = {}
        for split, k in (offsets.get("split_positions") or {}).items():
            n, s = (int(x) for x in split.split(":"))
            out[(s, n)] = int(k or 0)
        return out

    @staticmethod
    def seqs_emitted(offsets: dict[str, Any]) -> list[int]:
        """Every seq emitted by the subtask whose offsets these are."""
        return [s + k * n for (s, n), count in SequenceSource.emitted_per_split(offsets).items() for k in range(count)]


class _SequenceSplitReader(SplitReader):
    """Split ``s`` of ``n`` from its ``k``-th record on."""

    def __init__(self, source: SequenceSource, s: int, n: int, k: int) -> None:
        self.source, self.s, self.n, self.k = source, s, n, k
        self.limit = source.split_limit(s, n)
        self._started, self._from = time.monotonic(), k

    def poll(self, max_records: int) -> list[Any] | None:
        if self.limit is not None and self.k >= self.limit:
            return None
        m = max_records if self.limit is None else min(max_records, self.limit - self.k)
        rate = self.source.rate
        if rate is not None:
            m = min(m, max(int(rate * (time.monotonic() - self._started)) - (self.k - self._from), 0))
        record, s, n = self.source.record, self.s, self.n
        out = [record(s + k * n) for k in range(self.k, self.k + m)]
        self.k += m
        return out

    def position(self) -> Any:
        return self.k

    def lag(self) -> int | None:
        """Records left of a bounded split (None: unbounded)."""
        return None if self.limit is None else max(self.limit - self.k, 0)

    def wait_hint(self) -> float | None:
        rate = self.source.rate
        return None if rate is None else 1.0 / rate
