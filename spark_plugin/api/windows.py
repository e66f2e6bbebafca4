"""Event-time windows: assigners (tumbling, sliding, session), window functions (reduce, aggregate, process), the
window operator with allowed lateness and a side output for late records (Flink's ``WindowOperator`` with its
``EventTimeTrigger``).

A window ``[start, end)`` fires once the watermark reaches its last millisecond ``end - 1``. A record is *late*
when every window it belongs to ended ``allowed_lateness`` ms or more before the watermark; late records go to the
side output (``late_records()``), or are dropped when nothing reads it. A record that is behind the watermark but
within the allowed lateness joins its window, which fires again at once with the new contents; the window's state
is dropped once the watermark passes ``end - 1 + allowed_lateness``.

Window contents and timers are kept by key group, so a checkpoint holds them by key group and a rescaled restore
loads those of its range.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from spark_plugin.api.operators import Emit, Operator
from spark_plugin.api.timers import EVENT_TIME, TimedOperator
from spark_plugin.api.watermarks import checked_timestamp


class TimeWindow(NamedTuple):
    """The event time ``[start, end)`` in epoch ms."""

    start: int
    end: int

    @property
    def max_timestamp(self) -> int:
        return self.end - 1

    def intersects(self, other: TimeWindow) -> bool:
        """Overlapping or touching (session windows that touch merge, as in Flink and Spark SQL)."""
        return self.start <= other.end and other.start <= self.end

    def cover(self, other: TimeWindow) -> TimeWindow:
        return TimeWindow(min(self.start, other.start), max(self.end, other.end))


# ====================================================================================== assigners


class WindowAssigner:
    """Assigns a record's timestamp to its windows."""

    merging = False

    def assign(self, timestamp: int) -> list[TimeWindow]:
        raise NotImplementedError


def _window_start(timestamp: int, offset: int, size: int) -> int:
    return timestamp - (timestamp - offset + size) % size


class TumblingEventTimeWindows(WindowAssigner):
    """Back-to-back windows of ``size`` ms, aligned to the epoch (plus ``offset``), as Spark SQL's ``window(ts,
    size)``."""

    def __init__(self, size: int, offset: int = 0) -> None:
        if size <= 0:
            raise ValueError(f"window size {size} ms must be positive")
        self.size, self.offset = size, offset % size

    @classmethod
    def of(cls, size: int, offset: int = 0) -> TumblingEventTimeWindows:
        return cls(size, offset)

    def assign(self, timestamp: int) -> list[TimeWindow]:
        start = _window_start(timestamp, self.offset, self.size)
        return [TimeWindow(start, start + self.size)]

    def __repr__(self) -> str:
        return f"TumblingEventTimeWindows.of({self.size})"


class SlidingEventTimeWindows(WindowAssigner):
    """Windows of ``size`` ms starting every ``slide`` ms; a record belongs to ``size / slide`` of them (Spark SQL's
    ``window(ts, size, slide)``)."""

    def __init__(self, size: int, slide: int, offset: int = 0) -> None:
        if size <= 0 or slide <= 0:
            raise ValueError(f"window size {size} ms and slide {slide} ms must be positive")
        self.size, self.slide, self.offset = size, slide, offset % slide

    @classmethod
    def of(cls, size: int, slide: int, offset: int = 0) -> SlidingEventTimeWindows:
        return cls(size, slide, offset)

    def assign(self, timestamp: int) -> list[TimeWindow]:
        last = _window_start(timestamp, self.offset, self.slide)
        return [TimeWindow(s, s + self.size) for s in range(last, timestamp - self.size, -self.slide)]

    def __repr__(self) -> str:
        return f"SlidingEventTimeWindows.of({self.size}, {self.slide})"


class EventTimeSessionWindows(WindowAssigner):
    """Per key, records less than ``gap`` ms apart (or exactly ``gap``: touching windows merge) form one session
    ``[first, last + gap)`` (Spark SQL's ``session_window(ts, gap)``)."""

    merging = True

    def __init__(self, gap: int) -> None:
        if gap <= 0:
            raise ValueError(f"session gap {gap} ms must be positive")
        self.gap = gap

    @classmethod
    def with_gap(cls, gap: int) -> EventTimeSessionWindows:
        return cls(gap)

    def assign(self, timestamp: int) -> list[TimeWindow]:
        return [TimeWindow(timestamp, timestamp + self.gap)]

    def __repr__(self) -> str:
        return f"EventTimeSessionWindows.with_gap({self.gap})"


# ====================================================================================== window functions

_EMPTY = object()


class WindowFunction:
    """What a window keeps and what it emits when it fires."""

    def add(self, contents: Any, record: Any) -> Any:
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def emit(self, key: Any, window: TimeWindow, contents: Any, out: Emit) -> None:
        raise NotImplementedError

    def functions(self) -> dict[str, Any]:
        return {}


class ReduceFunction(WindowFunction):
    """Keeps ``fn(fn(r1, r2), r3)...``; emits ``(key, start, end, reduced)``."""

    def __init__(self, fn: Callable[[Any, Any], Any]) -> None:
        self.fn = fn

    def add(self, contents: Any, record: Any) -> Any:
        return record if contents is _EMPTY else self.fn(contents, record)

    def merge(self, a: Any, b: Any) -> Any:
        return self.fn(a, b)

    def emit(self, key: Any, window: TimeWindow, contents: Any, out: Emit) -> None:
        out((key, window.start, window.end, contents))

    def functions(self) -> dict[str, Any]:
        return {"fn": self.fn}


class AggregateFunction(WindowFunction):
    """Keeps ``acc = add(acc, record)`` from ``zero()``; session windows merge accumulators with ``merge``; emits
    ``(key, start, end, result(acc))`` (``acc`` itself without ``result``)."""

    def __init__(self, zero: Callable[[], Any], add: Callable[[Any, Any], Any],
                 merge: Callable[[Any, Any], Any] | None = None, result: Callable[[Any], Any] | None = None) -> None:
        self.zero, self.add_fn, self.merge_fn, self.result = zero, add, merge, result

    def add(self, contents: Any, record: Any) -> Any:
        return self.add_fn(self.zero() if contents is _EMPTY else contents, record)

    def merge(self, a: Any, b: Any) -> Any:
        assert self.merge_fn is not None
        return self.merge_fn(a, b)

    def emit(self, key: Any, window: TimeWindow, contents: Any, out: Emit) -> None:
        out((key, window.start, window.end, contents if self.result is None else self.result(contents)))

    def functions(self) -> dict[str, Any]:
        fns = {"zero": self.zero, "add": self.add_fn}
        fns.update({k: v for k, v in (("merge", self.merge_fn), ("result", self.result)) if v is not None})
        return fns


class ProcessWindowFunction(WindowFunction):
    """Keeps the window's records; ``fn(key, window, records)`` returns the outputs (an iterable, or None)."""

    def __init__(self, fn: Callable[[Any, TimeWindow, list], Iterable | None]) -> None:
        self.fn = fn

    def add(self, contents: Any, record: Any) -> Any:
        if contents is _EMPTY:
            return [record]
        contents.append(record)
        return contents

    def merge(self, a: Any, b: Any) -> Any:
        return a + b

    def emit(self, key: Any, window: TimeWindow, contents: Any, out: Emit) -> None:
        result = self.fn(key, window, list(contents))
        if result is not None:
            for x in result:
                out(x)

    def functions(self) -> dict[str, Any]:
        return {"fn": self.fn}


# ====================================================================================== operators


def late_tag(window_operator_id: str) -> str:
    """The side output of a window operator's late records."""
    return f"{window_operator_id}.late"


class WindowOperator(TimedOperator):
    """Keyed event-time windows: contents ``{key: {window: contents}}`` in keyed state, one timer at each window's
    end and one at its cleanup time."""

    def __init__(self, id: str, key_fn: Callable, assigner: WindowAssigner, function: WindowFunction,
                 timestamp_fn: Callable[[Any], int], allowed_lateness: int = 0, **kw: Any) -> None:
        super().__init__(id, key_fn, **kw)
        if allowed_lateness < 0:
            raise ValueError(f"allowed_lateness {allowed_lateness} ms must not be negative")
        self.assigner = assigner
        self.function = function
        self.timestamp_fn = timestamp_fn
        self.allowed_lateness = allowed_lateness
        self.late_records = 0
        """Late records this subtask sent to the side output (or dropped, when nothing reads it)."""

    def functions(self) -> dict[str, Any]:
        return {**super().functions(), **self.function.functions()}

    def bind_side_outputs(self, emits: dict[str, Emit]) -> None:
        self._late = emits.get(late_tag(self.id))

    def bind(self, out: Emit) -> Emit:
        assert self.state is not None
        self._out = out
        self._late: Emit | None = getattr(self, "_late", None)
        groups, timers, fn = self.state.groups, self.timers, self.function
        key_fn, assign = self.key_fn, self.assigner.assign
        ts_fn = checked_timestamp(self.timestamp_fn, f"window operator {self.id!r}")
        lateness = self.allowed_lateness
        if self.assigner.merging:
            return self._bind_merging(out)

        def process(r: Any) -> None:
            ts = ts_fn(r)
            k = key_fn(r)
            kg = timers.key_group(k)
            wm = timers.watermark_of(kg)
            accepted = False
            for w in assign(ts):
                end = w.end - 1
                if end + lateness <= wm:
                    continue  # this window's state is gone: too late for it
                accepted = True
                group = groups.get(kg)
                if group is None:
                    group = groups[kg] = {}
                wins = group.get(k)
                if wins is None:
                    wins = group[k] = {}
                contents = wins[w] = fn.add(wins.get(w, _EMPTY), r)
                if end <= wm:
                    fn.emit(k, w, contents, out)  # a late firing: the window fired already, within its lateness
                else:
                    timers.register_event_time(k, end, w, kg)
                if lateness:
                    timers.register_event_time(k, end + lateness, w, kg)
            if not accepted:
                self._on_late(r)

        return process

    def _bind_merging(self, out: Emit) -> Emit:
        assert self.state is not None
        groups, timers, fn = self.state.groups, self.timers, self.function
        key_fn, assign = self.key_fn, self.assigner.assign
        ts_fn = checked_timestamp(self.timestamp_fn, f"window operator {self.id!r}")
        lateness = self.allowed_lateness

        def process(r: Any) -> None:
            ts = ts_fn(r)
            k = key_fn(r)
            kg = timers.key_group(k)
            wm = timers.watermark_of(kg)
            group = groups.get(kg) or {}
            wins = group.get(k) or {}
            (new,) = assign(ts)
            merged = new
            absorbed = [w for w in wins if w.intersects(new)]
            for w in absorbed:
                merged = merged.cover(w)
            # the windows absorbed may now touch others: merge until nothing more intersects
            while True:
                more = [w for w in wins if w not in absorbed and w.intersects(merged)]
                if not more:
                    break
                for w in more:
                    merged = merged.cover(w)
                absorbed.extend(more)
            end = merged.end - 1
            if end + lateness <= wm:
                self._on_late(r)
                return
            contents: Any = _EMPTY
            for w in sorted(absorbed):
                part = wins.pop(w)
                contents = part if contents is _EMPTY else fn.merge(contents, part)
                timers.delete_event_time(k, w.end - 1, w, kg)
                if lateness:
                    timers.delete_event_time(k, w.end - 1 + lateness, w, kg)
            contents = wins[merged] = fn.add(contents, r)
            group = groups.get(kg)
            if group is None:
                group = groups[kg] = {}
            group[k] = wins
            if end <= wm:
                fn.emit(k, merged, contents, out)
            else:
                timers.register_event_time(k, end, merged, kg)
            if lateness:
                timers.register_event_time(k, end + lateness, merged, kg)

        return process

    def _on_late(self, record: Any) -> None:
        self.late_records += 1
        if self._late is not None:
            self._late(record)

    def on_timer(self, domain: str, timestamp: int, key: Any, namespace: Any) -> None:
        if domain != EVENT_TIME:
            return
        assert self.state is not None
        window: TimeWindow = namespace
        kg = self.timers.key_group(key)
        group = self.state.groups.get(kg)
        wins = group.get(key) if group is not None else None
        if wins is None or window not in wins:
            return  # merged into a bigger session, or already cleaned up
        if timestamp == window.end - 1:
            self.function.emit(key, window, wins[window], self._out)
        if timestamp == window.end - 1 + self.allowed_lateness:
            del wins[window]
            if not wins:
                del group[key]  # type: ignore[union-attr]


class SideOutput(Operator):
    """Reads one side output (``side``) of the operator before it, e.g. a window's late records; the head of its
    own chain, never chained with that operator."""

    def __init__(self, id: str, side: str, **kw: Any) -> None:
        super().__init__(id, **kw)
        self.side = side

    def bind(self, out: Emit) -> Emit:
        return out
