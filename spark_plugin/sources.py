"""Sources with offsets: the sequence/generator source with a rate and key skew."""

from __future__ import annotations

import bisect
import time
from typing import Any


class Source:
    """A source subtask's reader. ``poll`` never blocks; offsets make a restore resume where a checkpoint was."""

    def open(self, subtask_index: int, parallelism: int) -> None:
        self.subtask_index = subtask_index
        self.parallelism = parallelism

    def poll(self, max_records: int) -> list[Any] | None:
        """Up to ``max_records`` records; [] when none is ready now; None when the source has ended."""
        raise NotImplementedError

    def wait_hint(self) -> float | None:
        """Seconds until ``poll`` may return records again (None: unknown, poll again when convenient)."""
        return None

    def offsets(self) -> dict[str, Any]:
        """The position to resume from, as JSON-compatible values."""
        raise NotImplementedError

    def seek(self, offsets: dict[str, Any]) -> None:
        """Resume from ``offsets`` taken by :meth:`offsets`."""
        raise NotImplementedError

    def close(self) -> Any:
        return None


def _uniform(seq: int) -> float:
    """A deterministic pseudo-random number in [0, 1) for sequence number ``seq`` (splitmix64)."""
    z = (seq + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z ^= z >> 31
    return (z >> 11) / float(1 << 53)


class SequenceSource(Source):
    """Emits ``(key, seq)`` records: subtask ``i`` of ``p`` emits seq ``i, i+p, i+2p, ...``.

    ``count`` bounds the total over all subtasks (None: unbounded), ``rate`` is records per second per subtask
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
        self.emitted = 0

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
        self._started = time.monotonic()
        self._emitted_at_start = self.emitted
        self._pad = "x" * self.payload

    def key_of(self, seq: int) -> int:
        return bisect.bisect_right(self._cdf, _uniform(seq))

    def _limit(self) -> int | None:
        if self.count is None:
            return None
        p, i = self.parallelism, self.subtask_index
        return (self.count - i + p - 1) // p if self.count > i else 0

    def poll(self, max_records: int) -> list[Any] | None:
        limit = self._limit()
        n = max_records
        if limit is not None:
            if self.emitted >= limit:
                return None
            n = min(n, limit - self.emitted)
        if self.rate is not None:
            allowed = int(self.rate * (time.monotonic() - self._started)) - (self.emitted - self._emitted_at_start)
            n = min(n, max(allowed, 0))
        p, i = self.parallelism, self.subtask_index
        out = []
        key_of = self.key_of
        for k in range(self.emitted, self.emitted + n):
            seq = i + k * p
            out.append((key_of(seq), seq, self._pad) if self.payload else (key_of(seq), seq))
        self.emitted += n
        return out

    def wait_hint(self) -> float | None:
        if self.rate is None:
            return None
        return 1.0 / self.rate

    def offsets(self) -> dict[str, Any]:
        return {"emitted": self.emitted}

    def seek(self, offsets: dict[str, Any]) -> None:
        self.emitted = int(offsets.get("emitted", 0))
        self._started = time.monotonic()
        self._emitted_at_start = self.emitted
