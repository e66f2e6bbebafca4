"""``SequenceSource``: a generated source of ``(key, seq)`` records with offsets, a rate and key skew."""

from __future__ import annotations

import bisect
import time
from typing import Any

from spark_plugin.connectors.base import Source


def _uniform(seq: int) -> float:
    """A deterministic pseudo-random number in [0, 1) for sequence number ``seq`` (splitmix64)."""
    z = (seq + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z ^= z >> 31
    return (z >> 11) / float(1 << 53)


class SequenceSource(Source):
    """Emits ``(key, seq)`` records from interleaved splits: of ``n`` splits, split ``s`` emits seq ``s, s+n, s+2n,
    ...``. A job's first run has one split per source subtask; the splits stay when the source is rescaled, and each
    subtask reads the splits ``s`` with ``s % parallelism == index`` in turn, so every seq is emitted exactly once
    and in order within its split.

    ``count`` bounds the total over all splits (None: unbounded), ``rate`` is records per second per subtask
    (None: as fast as the output takes them), ``keys`` the number of distinct keys and ``skew`` the Zipf exponent
    of the key distribution (0: uniform). A record's key depends only on its seq, so a replay is identical.
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
            raise ValueError(f"rate {rate} must be positive (records per second per subtask) or None")
        if keys < 1:
            raise ValueError(f"keys {keys} must be at least 1")
        if skew < 0:
            raise ValueError(f"skew {skew} must not be negative")
        self.count = count
        self.rate = rate
        self.keys = keys
        self.skew = skew
        self.payload = payload
        self.splits = 0
        self.positions: dict[int, int] = {}
        """Records emitted so far of each split this subtask reads."""

    def open(self, subtask_index: int, parallelism: int) -> None:
        super().open(subtask_index, parallelism)
        weights = [1.0 / ((k + 1) ** self.skew) for k in range(self.keys)]
        total = sum(weights)
        acc = 0.0
        self._cdf = []
        for w in weights:
            acc += w / total
            self._cdf.append(acc)
        self._cdf[-1] = 1.0
        self._pad = "x" * self.payload
        self._own(parallelism, {subtask_index: 0})

    def _own(self, splits: int, positions: dict[int, int]) -> None:
        self.splits = splits
        self.positions = dict(sorted(positions.items()))
        self._started = time.monotonic()
        self._emitted_at_start = self.emitted

    @property
    def emitted(self) -> int:
        return sum(self.positions.values())

    def key_of(self, seq: int) -> int:
        return bisect.bisect_right(self._cdf, _uniform(seq))

    def _split_limit(self, split: int) -> int | None:
        if self.count is None:
            return None
        n = self.splits
        return (self.count - split + n - 1) // n if self.count > split else 0

    def _limit(self) -> int | None:
        """Records this subtask emits in all (None: unbounded)."""
        if self.count is None:
            return None
        return sum(self._split_limit(s) or 0 for s in self.positions)

    def poll(self, max_records: int) -> list[Any] | None:
        n = max_records
        if self.rate is not None:
            allowed = int(self.rate * (time.monotonic() - self._started)) - (self.emitted - self._emitted_at_start)
            n = min(n, max(allowed, 0))
        live = [s for s in self.positions if (lim := self._split_limit(s)) is None or self.positions[s] < lim]
        if not live:
            return None
        out: list[Any] = []
        key_of, pad, step = self.key_of, self._pad, self.splits
        while len(out) < n and live:
            for s in list(live):
                k = self.positions[s]
                seq = s + k * step
                out.append((key_of(seq), seq, pad) if self.payload else (key_of(seq), seq))
                self.positions[s] = k + 1
                lim = self._split_limit(s)
                if lim is not None and k + 1 >= lim:
                    live.remove(s)
                if len(out) >= n:
                    break
        return out

    def wait_hint(self) -> float | None:
        if self.rate is None:
            return None
        return 1.0 / self.rate

    def offsets(self) -> dict[str, Any]:
        return {"splits": self.splits, "positions": {str(s): k for s, k in self.positions.items()}}

    def seek(self, offsets: dict[str, Any]) -> None:
        if "positions" in offsets:
            self._own(int(offsets["splits"]), {int(s): int(k) for s, k in offsets["positions"].items()})
        else:  # offsets of a single split per subtask, as the first version of this source wrote them
            self._own(self.parallelism, {self.subtask_index: int(offsets.get("emitted", 0))})

    def restore_positions(self, positions: list[dict[str, Any]]) -> None:
        """Take the splits this subtask owns at its parallelism, each where the checkpoint left it."""
        merged: dict[int, int] = {}
        splits = len(positions)
        for old_index, offsets in enumerate(positions):
            if "positions" in offsets:
                splits = int(offsets["splits"])
                merged.update({int(s): int(k) for s, k in offsets["positions"].items()})
            else:
                merged[old_index] = int(offsets.get("emitted", 0))
        mine = range(self.subtask_index, splits, self.parallelism)
        self._own(splits, {s: merged.get(s, 0) for s in mine})
