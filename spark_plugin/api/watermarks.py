"""Event time at a source: the watermark strategy a pipeline gives a source, and the watermarks per partition it
generates from it (Flink's ``WatermarkStrategy``, ``BoundedOutOfOrdernessWatermarks`` and per-split watermarks).

Event time is a field of the record, named by a function (as Spark SQL names a timestamp column):

    strategy = WatermarkStrategy.for_bounded_out_of_orderness(2_000, timestamp=lambda r: r[1]).with_idleness(10_000)
    p.source(events, id="events", watermarks=strategy)

or by a column name (:class:`ColumnTime`), which a batch source needs: a record batch's event time is the largest
value of that column, so its watermark advances a batch at a time:

    p.source(ParquetSource("events/", batches=True), watermarks=WatermarkStrategy.for_bounded_out_of_orderness(
        2_000, timestamp="ts").with_idleness(10_000))

Timestamps and watermarks are epoch milliseconds. A watermark ``w`` says that event time up to ``w`` (inclusive) is
complete: a record with a timestamp at or before the current watermark is *late*.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
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


class ColumnTime:
    """The event time in column ``column``: of a row (a dict), its value; of a ``pyarrow.RecordBatch``, the largest
    value in the column (nulls aside), the batch's event time for watermarks. Integer columns are epoch ms,
    timestamp columns are read as epoch ms."""

    def __init__(self, column: str) -> None:
        if not isinstance(column, str) or not column:
            raise ValueError(f"a time column is named by a non-empty str, not {column!r}")
        self.column = column

    def __call__(self, record: Any) -> Any:
        if isinstance(record, dict):
            return record[self.column]
        if record.num_rows == 0:
            return None  # no event time: the watermark generator does not see an empty batch
        import pyarrow.compute as pc

        return pc.max(epoch_ms(record, self.column)).as_py()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ColumnTime) and other.column == self.column

    def __hash__(self) -> int:
        return hash(self.column)

    def __repr__(self) -> str:
        return f"ColumnTime({self.column!r})"


def epoch_ms(batch: Any, column: str) -> Any:
    """Column ``column`` of ``batch`` as epoch milliseconds (an int64 Arrow array): an integer column as it is, a
    timestamp column converted; any other type raises ValueError naming the column and its type."""
    import pyarrow as pa

    if column not in batch.schema.names:
        raise KeyError(f"the time column {column!r} is not in the batch (it has {batch.schema.names})")
    values = batch.column(column)
    if pa.types.is_timestamp(values.type):
        return values.cast(pa.timestamp("ms")).cast(pa.int64())
    if pa.types.is_integer(values.type) or pa.types.is_null(values.type):
        return values.cast(pa.int64())
    raise ValueError(
        f"the time column {column!r} is of type {values.type}; event time is an integer column of epoch "
        "milliseconds or a timestamp column: convert it with map_batches first"
    )


def _brief(record: Any) -> str:
    text = repr(record)
    return text if len(text) <= 200 else text[:199] + "…"


@dataclass(frozen=True)
class WatermarkStrategy:
    """How a source assigns event time and generates watermarks.

    ``timestamp(record)`` is the record's event time (epoch ms); a str names a column instead (:class:`ColumnTime`,
    the form batch sources need: a batch's event time is that column's largest value). The watermark trails the
    largest timestamp seen by ``max_out_of_orderness`` ms (per partition of the source, the source's watermark being
    the minimum over its partitions), so records up to that much out of order are not late. A partition that sends nothing for
    ``idle_timeout`` ms is idle and holds nothing back until it sends again. Watermarks go out every ``interval``
    ms (Flink's auto-watermark interval), or with ``interval=0`` right after each record that advances them.
    """

    timestamp: Callable[[Any], int] | str
    max_out_of_orderness: int = 0
    idle_timeout: int | None = None
    interval: int = 200

    def __post_init__(self) -> None:
        if isinstance(self.timestamp, str):
            object.__setattr__(self, "timestamp", ColumnTime(self.timestamp))
        if not callable(self.timestamp):
            raise ValueError(f"timestamp must be a function of the record or a column name, got {self.timestamp!r}")
        if self.max_out_of_orderness < 0:
            raise ValueError(f"max_out_of_orderness {self.max_out_of_orderness} ms must not be negative")
        if self.idle_timeout is not None and self.idle_timeout <= 0:
            raise ValueError(f"idle_timeout {self.idle_timeout} ms must be positive (or None: never idle)")
        if self.interval < 0:
            raise ValueError(f"interval {self.interval} ms must not be negative (0: after every record)")

    @classmethod
    def for_bounded_out_of_orderness(cls, max_out_of_orderness: int,
                                     timestamp: Callable[[Any], int] | str) -> WatermarkStrategy:
        """Records may arrive up to ``max_out_of_orderness`` ms after later ones and still be on time."""
        return cls(timestamp, max_out_of_orderness)

    @classmethod
    def for_monotonous_timestamps(cls, timestamp: Callable[[Any], int] | str) -> WatermarkStrategy:
        """Timestamps never go back (per partition)."""
        return cls(timestamp, 0)

    def with_idleness(self, idle_timeout: int) -> WatermarkStrategy:
        """A partition without records for ``idle_timeout`` ms stops holding the watermark back."""
        return replace(self, idle_timeout=idle_timeout)

    def with_interval(self, interval: int) -> WatermarkStrategy:
        """Emit watermarks every ``interval`` ms; 0: after every record that advances them (deterministic)."""
        return replace(self, interval=interval)


class _Partition:
    __slots__ = ("max_ts", "idle", "seen", "quiet")

    def __init__(self) -> None:
        self.max_ts = MIN_WATERMARK
        self.idle = False
        self.seen = False
        self.quiet = 0
        """Milliseconds the source was read since this partition last sent a record."""


class PartitionWatermarks:
    """One source subtask's watermark generator: the largest timestamp and the idleness of each of its partitions.

    The subtask's watermark is the minimum over its active partitions of ``largest timestamp - max_out_of_orderness
    - 1``; it is idle when all of its partitions are.

    A partition is idle once it sent nothing for ``idle_timeout`` ms *of reading*: the clock of its silence runs
    only while the subtask polls its source, and pauses (it does not restart) while it does not (backpressure). So a
    partition with nothing to give goes idle under backpressure too, only later, and one that nobody asked for
    records is never idle for that.
    """

    def __init__(self, strategy: WatermarkStrategy, partitions: list[Any], now_ms: int) -> None:
        self.strategy = strategy
        self.delay = strategy.max_out_of_orderness + 1
        self.parts: dict[Any, _Partition] = {p: _Partition() for p in (partitions or [None])}
        self.last_tick = now_ms

    def on_record(self, timestamp: int, partition: Any, now_ms: int) -> bool:
        """Account for one record; True when its partition was idle and is active again."""
        st = self.parts.get(partition)
        if st is None:
            st = self.parts[partition] = _Partition()
        st.seen = True
        st.quiet = 0
        if timestamp > st.max_ts:
            st.max_ts = timestamp
        if st.idle:
            st.idle = False
            return True
        return False

    def tick(self, now_ms: int, asked: bool = True) -> None:
        """The periodic check: the time since the last check counts towards the silence of every partition that
        sent nothing in it, if the source was ``asked`` for records in it; a partition silent for the idle timeout
        is idle. Without ``asked`` (the subtask did not poll its source since the last check: its output was full)
        the clocks pause: an idle partition is one with nothing to give, not one nobody asked."""
        elapsed, self.last_tick = max(now_ms - self.last_tick, 0), now_ms
        timeout = self.strategy.idle_timeout
        for st in self.parts.values():
            if st.seen:
                st.seen = False
            elif asked and not st.idle:
                st.quiet += elapsed
                if timeout is not None and st.quiet >= timeout:
                    st.idle = True

    def track(self, partitions: list[Any]) -> None:
        """The source's partitions now (splits discovered or restored since): a new one holds the watermark back
        until it sends or goes idle; one the subtask no longer reads holds nothing back."""
        wanted = partitions or [None]
        if set(wanted) == set(self.parts):
            return
        self.parts = {p: self.parts.get(p) or _Partition() for p in wanted}

    def finished(self, partitions: Iterable[Any]) -> None:
        """Partitions read to their end (a file read through, a bounded split): they never send again, so they
        hold nothing back from now on, as if idle for good. A source that discovers new splits goes on with those;
        without this, a finished split held its subtask's watermark at its last record's time until the idle
        timeout, or for ever without one."""
        for p in partitions:
            st = self.parts.get(p)
            if st is not None:
                st.idle = True

    @property
    def idle(self) -> bool:
        return all(st.idle for st in self.parts.values())

    def current(self) -> int:
        """The watermark of the active partitions (MIN_WATERMARK until each of them sent a record). When every
        partition is idle, none holds anything back: the highest any of them reached (as the valve over input
        channels does), so partitions that go quiet in the same check (one that never sent, and one read to its
        end) still let the watermark reach what was read."""
        low = None
        high = MIN_WATERMARK
        for st in self.parts.values():
            if st.max_ts > high:
                high = st.max_ts
            if st.idle:
                continue
            if st.max_ts == MIN_WATERMARK:
                return MIN_WATERMARK
            if low is None or st.max_ts < low:
                low = st.max_ts
        if low is None:
            return MIN_WATERMARK if high == MIN_WATERMARK else high - self.delay
        return low - self.delay

    def snapshot(self) -> dict[Any, tuple[int, bool]]:
        return {p: (st.max_ts, st.idle) for p, st in self.parts.items()}

    def restore(self, snapshots: list[dict[Any, tuple[int, bool]]], now_ms: int) -> None:
        """Load the partitions of the snapshots (after a rescale, of several old subtasks) that this subtask reads;
        a subtask that reads one undeclared partition takes every old one, at the lowest of their timestamps."""
        restored: dict[Any, tuple[int, bool]] = {}
        for parts in snapshots:
            for p, (max_ts, idle) in parts.items():
                if p not in self.parts and str(p) in self.parts:
                    p = str(p)  # a checkpoint from before partitions were splits (named by str)
                if p not in self.parts:
                    if set(self.parts) != {None}:
                        continue  # another subtask reads that partition now
                    p = None
                if p in restored:  # two old streams now one: the lower one bounds what is late
                    max_ts, idle = min(max_ts, restored[p][0]), idle and restored[p][1]
                restored[p] = (max_ts, idle)
        for p, (max_ts, idle) in restored.items():
            st = self.parts[p]
            st.max_ts, st.idle, st.quiet = max_ts, idle, 0
        self.last_tick = now_ms
