"""Keyed timers by key group (Flink's ``InternalTimerService``), the operators that own them, and the keyed process
function with timers users write.

A timer is ``(timestamp, key, namespace)`` in the event-time or the processing-time domain; registering the same
timer twice keeps one, deleting one that does not exist does nothing. Timers are kept by key group, like keyed state
(``spark_plugin.api.state``), so a checkpoint stores them by key group and a rescaled restore loads those of the
subtask's key-group range.

The operator never fires its own timers: the subtask's loop (``spark_plugin.task.event_time``) pops due timers one
at a time and acts on a priority barrier between two of them, so a burst of due timers never holds a checkpoint
back.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any

from contract.keygroups import KEY_HASH_VERSION, key_group
from spark_plugin.api.operators import Emit, KeyedOperator
from spark_plugin.api.state import ValueState, not_owned, rehashed
from spark_plugin.api.watermarks import MIN_WATERMARK, checked_timestamp

EVENT_TIME = "event"
PROCESSING_TIME = "processing"

Timer = tuple[str, int, Any, Any]
"""A due timer as the loop hands it to its operator: ``(domain, timestamp, key, namespace)``."""


def now_ms() -> int:
    return int(time.time() * 1000)


class _Domain:
    """The timers of one time domain: a set per key group, and a heap in timestamp order (entries of deleted timers
    stay in the heap and are skipped when they come up)."""

    def __init__(self) -> None:
        self.groups: dict[int, set[tuple[int, Any, Any]]] = {}
        self.heap: list[tuple[int, int, int, Any, Any]] = []
        self._seq = itertools.count()

    def add(self, kg: int, ts: int, key: Any, ns: Any) -> None:
        timers = self.groups.get(kg)
        if timers is None:
            timers = self.groups[kg] = set()
        timer = (ts, key, ns)
        if timer not in timers:
            timers.add(timer)
            heapq.heappush(self.heap, (ts, next(self._seq), kg, key, ns))

    def remove(self, kg: int, ts: int, key: Any, ns: Any) -> bool:
        timers = self.groups.get(kg)
        if timers is None or (ts, key, ns) not in timers:
            return False
        timers.discard((ts, key, ns))
        if not timers:
            del self.groups[kg]
        return True

    def head(self) -> tuple[int, int, Any, Any] | None:
        """The earliest live timer ``(ts, kg, key, ns)``, dropping deleted ones from the top of the heap."""
        heap = self.heap
        while heap:
            ts, _, kg, key, ns = heap[0]
            timers = self.groups.get(kg)
            if timers is not None and (ts, key, ns) in timers:
                return ts, kg, key, ns
            heapq.heappop(heap)
        return None

    def pop(self) -> tuple[int, int, Any, Any]:
        ts, _, kg, key, ns = heapq.heappop(self.heap)
        self.remove(kg, ts, key, ns)
        return ts, kg, key, ns

    def __len__(self) -> int:
        return sum(len(t) for t in self.groups.values())


class TimerService:
    """One keyed operator's event-time and processing-time timers, for the key groups its subtask owns.

    ``watermark`` is the operator's event time: timers at or before it are due. After a rescaled restore a key group
    may also carry the watermark its old subtask had reached (its *floor*): its timers up to the floor are due at
    once, and its records are judged late against at least the floor, until the watermark passes it.
    """

    def __init__(self, max_parallelism: int, key_group_range: tuple[int, int]) -> None:
        self.max_parallelism = max_parallelism
        self.key_group_range = key_group_range
        self.watermark = MIN_WATERMARK
        self.event = _Domain()
        self.processing = _Domain()
        self.floors: dict[int, int] = {}
        self._restored_due: list[tuple[int, int, Any, Any]] = []
        """Timers due under their key group's floor after a restore, latest first."""

    def key_group(self, key: Any) -> int:
        """The key group of ``key``, which this subtask must own."""
        kg = key_group(key, self.max_parallelism)
        lo, hi = self.key_group_range
        if not lo <= kg <= hi:
            raise not_owned(key, kg, self.key_group_range)
        return kg

    # ------------------------------------------------------------------ register, delete

    def register_event_time(self, key: Any, ts: int, ns: Any = None, kg: int | None = None) -> None:
        self.event.add(self.key_group(key) if kg is None else kg, ts, key, ns)

    def delete_event_time(self, key: Any, ts: int, ns: Any = None, kg: int | None = None) -> None:
        self.event.remove(self.key_group(key) if kg is None else kg, ts, key, ns)

    def register_processing_time(self, key: Any, ts: int, ns: Any = None, kg: int | None = None) -> None:
        self.processing.add(self.key_group(key) if kg is None else kg, ts, key, ns)

    def delete_processing_time(self, key: Any, ts: int, ns: Any = None, kg: int | None = None) -> None:
        self.processing.remove(self.key_group(key) if kg is None else kg, ts, key, ns)

    # ------------------------------------------------------------------ event time

    def advance(self, watermark: int) -> None:
        """The operator's event time advanced (never goes back)."""
        if watermark > self.watermark:
            self.watermark = watermark
            if self.floors:
                self.floors = {kg: f for kg, f in self.floors.items() if f > watermark}

    def watermark_of(self, kg: int) -> int:
        """The event time that records of key group ``kg`` are judged against."""
        if self.floors:
            floor = self.floors.get(kg)
            if floor is not None and floor > self.watermark:
                return floor
        return self.watermark

    def next_event_time(self) -> int | None:
        """The timestamp of the earliest event-time timer (the output watermark may not pass it before it fired)."""
        head = self.event.head()
        first = head[0] if head is not None else None
        if self._restored_due:
            ts = self._restored_due[-1][0]
            first = ts if first is None else min(first, ts)
        return first

    # ------------------------------------------------------------------ firing

    def has_due(self, now: int) -> bool:
        if self._restored_due:
            return True
        head = self.event.head()
        if head is not None and head[0] <= self.watermark:
            return True
        head = self.processing.head()
        return head is not None and head[0] <= now

    def pop_due(self, now: int) -> Timer | None:
        """Remove and return the next due timer: event time first, in timestamp order; None when none is due."""
        while self._restored_due:
            ts, kg, key, ns = self._restored_due.pop()
            if self.event.remove(kg, ts, key, ns):
                return (EVENT_TIME, ts, key, ns)
        head = self.event.head()
        if head is not None and head[0] <= self.watermark:
            ts, _, key, ns = self.event.pop()
            return (EVENT_TIME, ts, key, ns)
        head = self.processing.head()
        if head is not None and head[0] <= now:
            ts, _, key, ns = self.processing.pop()
            return (PROCESSING_TIME, ts, key, ns)
        return None

    def next_processing_time(self) -> int | None:
        head = self.processing.head()
        return None if head is None else head[0]

    # ------------------------------------------------------------------ checkpoints

    def snapshot(self, event: bool = True) -> dict[str, Any]:
        """The timers by key group, and the watermark they were taken at (with the range it applies to); without
        the event-time timers (an empty ``event``) when the operator keeps those in its own state."""
        return {
            "watermark": self.watermark,
            "range": self.key_group_range,
            "floors": dict(self.floors),
            "event": {kg: list(t) for kg, t in self.event.groups.items()} if event else {},
            "processing": {kg: list(t) for kg, t in self.processing.groups.items()},
        }

    def restore(self, snapshot: dict[str, Any], key_hash: int = KEY_HASH_VERSION) -> None:
        """Load one old subtask's timers of the key groups in this subtask's range; the watermark that subtask had
        reached becomes the floor of those key groups. Call :meth:`restored` once every slice is loaded. Timers
        keyed by an older key hash (``key_hash``) must have kept their key groups (a timer's key group has its own
        floor: a timer does not move)."""
        lo, hi = self.key_group_range
        old_lo, old_hi = snapshot["range"]
        for kg in range(max(lo, old_lo), min(hi, old_hi) + 1):
            floor = max(snapshot["watermark"], snapshot["floors"].get(kg, MIN_WATERMARK))
            if floor > self.floors.get(kg, MIN_WATERMARK):
                self.floors[kg] = floor
        for domain, timers in ((self.event, snapshot["event"]), (self.processing, snapshot["processing"])):
            for kg, group in timers.items():
                if lo <= kg <= hi:
                    for ts, key, ns in group:
                        if key_hash != KEY_HASH_VERSION:
                            now = key_group(key, self.max_parallelism)
                            if now != kg:
                                raise rehashed(key, kg, now, key_hash, "and a timer cannot move: start the job "
                                                                       "without this checkpoint")
                        domain.add(kg, ts, key, ns)

    def restored(self, watermark: int) -> None:
        """Every slice is loaded and the subtask's event time is ``watermark``: the timers under their key group's
        floor are due first, in timestamp order, before any input."""
        due = []
        for kg, floor in self.floors.items():
            for ts, key, ns in self.event.groups.get(kg, ()):
                if ts <= floor:
                    due.append((ts, kg, key, ns))
        self._restored_due = sorted(due, key=lambda t: t[0], reverse=True)  # popped from the end: earliest first
        self.advance(watermark)


class TimedOperator(KeyedOperator):
    """A keyed operator with timers. The subtask advances its event time (``advance_watermark``) and hands it its
    due timers one at a time (``on_timer``); results go to the function ``bind`` received."""

    timestamp_fn: Callable[[Any], int] | None = None
    moves_rehashed_keys = False  # a key's timers stay in their key group (its floor is that group's)

    def open(self, subtask_index: int, parallelism: int, max_parallelism: int) -> None:
        super().open(subtask_index, parallelism, max_parallelism)
        assert self.state is not None
        self.timers = TimerService(max_parallelism, self.state.key_group_range)
        self._out: Emit = lambda record: None

    def functions(self) -> dict[str, Any]:
        fns = super().functions()
        if self.timestamp_fn is not None:
            fns["timestamp"] = self.timestamp_fn
        return fns

    def advance_watermark(self, watermark: int) -> None:
        self.timers.advance(watermark)

    def on_timer(self, domain: str, timestamp: int, key: Any, namespace: Any) -> None:
        raise NotImplementedError

    def timers_fired(self) -> None:
        """Called once after a round of ``on_timer`` calls, before the subtask takes anything else (a barrier, a
        record, its output watermark): an operator that gathers what its timers emit (one batch per window, not
        one per key group) sends it here."""

    def snapshot(self, checkpoint_id: int) -> Any:
        state = super().snapshot(checkpoint_id)
        state["timers"] = self.timers.snapshot()
        return state

    def restore(self, state: Any) -> None:
        super().restore(state)
        if state and "timers" in state:
            self.timers.restore(state["timers"], self.restored_key_hash)


# ====================================================================================== keyed process function


class KeyedProcessFunction:
    """Override ``process`` (and ``on_timer`` when registering timers); pass an instance to
    ``key_by(...).process(...)``. Both return an iterable of output records, or None."""

    def process(self, key: Any, record: Any, ctx: ProcessContext) -> Any:
        raise NotImplementedError

    def on_timer(self, key: Any, timestamp: int, ctx: ProcessContext) -> Any:
        return None


class ProcessContext:
    """What a :class:`KeyedProcessFunction` sees: the key's value state, the record's (or timer's) timestamp, the
    current watermark, and the key's timers."""

    def __init__(self, timers: TimerService, value: ValueState) -> None:
        self._timers = timers
        self.state = value
        self.key: Any = None
        self.timestamp: int | None = None
        """The record's event time (None without a timestamp function), or the firing timer's time."""
        self.time_domain: str | None = None
        """In ``on_timer``: ``"event"`` or ``"processing"``."""
        self._kg = 0

    def _at(self, key: Any, timestamp: int | None, domain: str | None) -> None:
        self.key = key
        self.state._key = key
        self.timestamp = timestamp
        self.time_domain = domain
        self._kg = self._timers.key_group(key)

    @property
    def watermark(self) -> int:
        """The current event time of this key (MIN_WATERMARK before the first watermark)."""
        return self._timers.watermark_of(self._kg)

    def processing_time(self) -> int:
        return now_ms()

    def register_event_time_timer(self, timestamp: int) -> None:
        self._timers.register_event_time(self.key, int(timestamp), None, self._kg)

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._timers.delete_event_time(self.key, int(timestamp), None, self._kg)

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._timers.register_processing_time(self.key, int(timestamp), None, self._kg)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._timers.delete_processing_time(self.key, int(timestamp), None, self._kg)


class TimedProcess(TimedOperator):
    """Runs a :class:`KeyedProcessFunction`: ``process`` per record, ``on_timer`` per due timer of the key."""

    def __init__(self, id: str, key_fn: Callable, fn: KeyedProcessFunction,
                 timestamp_fn: Callable[[Any], int] | None = None, **kw: Any) -> None:
        super().__init__(id, key_fn, **kw)
        self.fn = fn
        self.timestamp_fn = timestamp_fn

    def functions(self) -> dict[str, Any]:
        return {**super().functions(), "fn": self.fn.process}

    def bind(self, out: Emit) -> Emit:
        assert self.state is not None
        self._out = out
        self._ctx = ctx = ProcessContext(self.timers, ValueState(self.state))
        key_fn, fn = self.key_fn, self.fn
        ts_fn = checked_timestamp(self.timestamp_fn, f"process operator {self.id!r}") if self.timestamp_fn else None

        def process(r: Any) -> None:
            k = key_fn(r)
            ctx._at(k, ts_fn(r) if ts_fn is not None else None, None)
            result = fn.process(k, r, ctx)
            if result is not None:
                for x in result:
                    out(x)

        return process

    def on_timer(self, domain: str, timestamp: int, key: Any, namespace: Any) -> None:
        ctx = self._ctx
        ctx._at(key, timestamp, domain)
        result = self.fn.on_timer(key, timestamp, ctx)
        if result is not None:
            for x in result:
                self._out(x)
