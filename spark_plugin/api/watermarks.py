"""Event time at a source: the watermark strategy a pipeline gives a source, and the watermarks per partition it
generates from it (Flink's ``WatermarkStrategy``, ``BoundedOutOfOrdernessWatermarks`` and per-split watermarks).

Event time is a field of the record, named by a function (as Spark SQL names a timestamp column):

    strategy = WatermarkStrategy.for_bounded_out_of_orderness(2_000, timestamp=lambda r: r[1]).with_idleness(10_000)
    p.source(events, id="events", watermarks=strategy)

Timestamps and watermarks are epoch milliseconds. A watermark ``w`` says that event time up to ``w`` (inclusive) is
complete: a record with a timestamp at or before the current watermark is *late*.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

MIN_WATERMARK = -(2**63)
"""No event time is complete yet (Flink's ``Long.MIN_VALUE``)."""
MAX_WATERMARK = 2**63 - 1
"""All event time is complete: the input ended."""


def checked_timestamp(timestamp: Callable[[Any], int], where: str) -> Callable[[Any], int]:
    """``timestamp`` that refuses what is not event time: a timestamp that is not a finite number (None, a str,
    NaN) raises ValueError naming ``where`` and the record, instead of failing a comparison somewhere deeper (None)
    or being taken (NaN: its window never fires, and it keeps others from firing)."""

    def checked(record: Any) -> int:
        t = timestamp(record)
        if type(t) is int:
            return t
        if isinstance(t, numbers.Real) and not isinstance(t, bool) and math.isfinite(t):
            return t  # type: ignore[return-value]
        raise ValueError(
            f"{where}: the event time of record {_brief(record)} is {t!r}; a timestamp must be a finite number of "
            "epoch milliseconds (an int): filter such records out before, or give them a time"
        )

    return checked


def _brief(record: Any) -> str:
    text = repr(record)
    return text if len(text) <= 200 else text[:199] + "…"


@dataclass(frozen=True)
class WatermarkStrategy:
    """How a source assigns event time and generates watermarks.

    ``timestamp(record)`` is the record's event time (epoch ms). The watermark trails the largest timestamp seen by
    ``max_out_of_orderness`` ms (per partition of the source, the source's watermark being the minimum over its
    partitions), so records up to that much out of order are not late. A partition that sends nothing for
    ``idle_timeout`` ms is idle and holds nothing back until it sends again. Watermarks go out every ``interval``
    ms (Flink's auto-watermark interval), or with ``interval=0`` right after each record that advances them.
    """

    timestamp: Callable[[Any], int]
    max_out_of_orderness: int = 0
    idle_timeout: int | None = None
    interval: int = 200

    def __post_init__(self) -> None:
        if not callable(self.timestamp):
            raise ValueError(f"timestamp must be a function of the record, got {self.timestamp!r}")
        if self.max_out_of_orderness < 0:
            raise ValueError(f"max_out_of_orderness {self.max_out_of_orderness} ms must not be negative")
        if self.idle_timeout is not None and self.idle_timeout <= 0:
            raise ValueError(f"idle_timeout {self.idle_timeout} ms must be positive (or None: never idle)")
        if self.interval < 0:
            raise ValueError(f"interval {self.interval} ms must not be negative (0: after every record)")

    @classmethod
    def for_bounded_out_of_orderness(cls, max_out_of_orderness: int, timestamp: Callable[[Any], int]) -> WatermarkStrategy:
        """Records may arrive up to ``max_out_of_orderness`` ms after later ones and still be on time."""
        return cls(timestamp, max_out_of_orderness)

    @classmethod
    def for_monotonous_timestamps(cls, timestamp: Callable[[Any], int]) -> WatermarkStrategy:
        """Timestamps never go back (per partition)."""
        return cls(timestamp, 0)

    def with_idleness(self, idle_timeout: int) -> WatermarkStrategy:
        """A partition without records for ``idle_timeout`` ms stops holding the watermark back."""
        return replace(self, idle_timeout=idle_timeout)

    def with_interval(self, interval: int) -> WatermarkStrategy:
        """Emit watermarks every ``interval`` ms; 0: after every record that advances them (deterministic)."""
        return replace(self, interval=interval)


class _Partition:
    __slots__ = ("max_ts", "idle", "seen", "last_active")

    def __init__(self, now_ms: int) -> None:
        self.max_ts = MIN_WATERMARK
        self.idle = False
        self.seen = False
        self.last_active = now_ms


class PartitionWatermarks:
    """One source subtask's watermark generator: the largest timestamp and the idleness of each of its partitions.

    The subtask's watermark is the minimum over its active partitions of ``largest timestamp - max_out_of_orderness
    - 1``; it is idle when all of its partitions are.
    """

    def __init__(self, strategy: WatermarkStrategy, partitions: list[Any], now_ms: int) -> None:
        self.strategy = strategy
        self.delay = strategy.max_out_of_orderness + 1
        self.parts: dict[Any, _Partition] = {p: _Partition(now_ms) for p in (partitions or [None])}

    def on_record(self, timestamp: int, partition: Any, now_ms: int) -> bool:
        """Account for one record; True when its partition was idle and is active again."""
        st = self.parts.get(partition)
        if st is None:
            st = self.parts[partition] = _Partition(now_ms)
        st.seen = True
        if timestamp > st.max_ts:
            st.max_ts = timestamp
        if st.idle:
            st.idle = False
            st.last_active = now_ms
            return True
        return False

    def tick(self, now_ms: int, asked: bool = True) -> None:
        """The periodic check: mark partitions idle that sent nothing for the idle timeout while the source was
        asked for records. Without ``asked`` (the subtask did not poll its source since the last check, e.g. under
        backpressure) no partition grows idler: an idle partition is one with nothing to give, not one nobody
        asked."""
        timeout = self.strategy.idle_timeout
        for st in self.parts.values():
            if st.seen or not asked:
                st.seen = False
                if not st.idle:
                    st.last_active = now_ms
            elif timeout is not None and not st.idle and now_ms - st.last_active >= timeout:
                st.idle = True

    @property
    def idle(self) -> bool:
        return all(st.idle for st in self.parts.values())

    def current(self) -> int:
        """The watermark of the active partitions (MIN_WATERMARK until each of them sent a record)."""
        low = None
        for st in self.parts.values():
            if st.idle:
                continue
            if st.max_ts == MIN_WATERMARK:
                return MIN_WATERMARK
            if low is None or st.max_ts < low:
                low = st.max_ts
        return MIN_WATERMARK if low is None else low - self.delay

    def snapshot(self) -> dict[Any, tuple[int, bool]]:
        return {p: (st.max_ts, st.idle) for p, st in self.parts.items()}

    def restore(self, snapshots: list[dict[Any, tuple[int, bool]]], now_ms: int) -> None:
        """Load the partitions of the snapshots (after a rescale, of several old subtasks) that this subtask reads;
        a subtask that reads one undeclared partition takes every old one, at the lowest of their timestamps."""
        restored: dict[Any, tuple[int, bool]] = {}
        for parts in snapshots:
            for p, (max_ts, idle) in parts.items():
                if p not in self.parts:
                    if set(self.parts) != {None}:
                        continue  # another subtask reads that partition now
                    p = None
                if p in restored:  # two old streams now one: the lower one bounds what is late
                    max_ts, idle = min(max_ts, restored[p][0]), idle and restored[p][1]
                restored[p] = (max_ts, idle)
        for p, (max_ts, idle) in restored.items():
            st = self.parts[p]
            st.max_ts, st.idle, st.last_active = max_ts, idle, now_ms
