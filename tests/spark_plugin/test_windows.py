"""Window assignment (tumbling, sliding, session merging), window functions, allowed lateness and the late records,
with the window operator driven directly: records in, watermarks advanced, due timers fired."""

from __future__ import annotations

import operator
import pickle

import pytest

from spark_plugin.api.timers import EVENT_TIME
from spark_plugin.api.windows import (
    AggregateFunction,
    EventTimeSessionWindows,
    ProcessWindowFunction,
    ReduceFunction,
    SlidingEventTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    WindowOperator,
    late_tag,
)


def test_tumbling_windows_are_aligned_to_the_epoch():
    w = TumblingEventTimeWindows.of(10)
    assert w.assign(0) == [TimeWindow(0, 10)]
    assert w.assign(9) == [TimeWindow(0, 10)]
    assert w.assign(10) == [TimeWindow(10, 20)]
    assert w.assign(-1) == [TimeWindow(-10, 0)]
    assert TumblingEventTimeWindows.of(10, offset=3).assign(12) == [TimeWindow(3, 13)]


def test_a_record_belongs_to_size_over_slide_sliding_windows():
    w = SlidingEventTimeWindows.of(10, 5)
    assert sorted(w.assign(7)) == [TimeWindow(0, 10), TimeWindow(5, 15)]
    assert sorted(w.assign(0)) == [TimeWindow(-5, 5), TimeWindow(0, 10)]
    assert len(SlidingEventTimeWindows.of(60, 20).assign(1234)) == 3


def test_touching_session_windows_intersect():
    assert TimeWindow(0, 10).intersects(TimeWindow(10, 20))
    assert not TimeWindow(0, 10).intersects(TimeWindow(11, 20))


class Harness:
    """A window operator of one subtask, its outputs and late records; ``advance`` fires what is due."""

    def __init__(self, assigner, function, lateness: int = 0) -> None:
        self.op = WindowOperator("w", lambda r: r[0], assigner, function, lambda r: r[1], lateness)
        self.op.open(0, 1, 8)
        self.out: list = []
        self.late: list = []
        self.process = self.op.bind(self.out.append)
        self.op.bind_side_outputs({late_tag("w"): self.late.append})

    def advance(self, watermark: int) -> list:
        self.op.advance_watermark(watermark)
        before = len(self.out)
        while (t := self.op.timers.pop_due(0)) is not None:
            self.op.on_timer(*t)
        return self.out[before:]


def test_a_tumbling_window_fires_once_the_watermark_reaches_its_last_millisecond():
    h = Harness(TumblingEventTimeWindows.of(10), AggregateFunction(lambda: 0, lambda n, r: n + 1))
    for r in [("a", 1), ("a", 9), ("b", 5), ("a", 12)]:
        h.process(r)
    assert h.advance(8) == []
    assert sorted(h.advance(9)) == [("a", 0, 10, 2), ("b", 0, 10, 1)]
    assert h.advance(19) == [("a", 10, 20, 1)]
    assert h.op.state.snapshot() == {}  # fired windows without lateness are gone


def test_reduce_and_process_window_functions():
    h = Harness(TumblingEventTimeWindows.of(10), ReduceFunction(lambda a, b: (a[0], max(a[1], b[1]))))
    for r in [("a", 3), ("a", 7), ("a", 5)]:
        h.process(r)
    assert h.advance(100) == [("a", 0, 10, ("a", 7))]
    p = Harness(TumblingEventTimeWindows.of(10),
                ProcessWindowFunction(lambda key, w, records: [(key, w.end, sorted(t for _, t in records))]))
    for r in [("a", 3), ("a", 7), ("a", 5)]:
        p.process(r)
    assert p.advance(100) == [("a", 10, [3, 5, 7])]


def test_records_behind_the_watermark_within_the_lateness_fire_their_window_again_later_ones_go_to_the_side():
    h = Harness(TumblingEventTimeWindows.of(10), AggregateFunction(lambda: 0, lambda n, r: n + 1), lateness=5)
    h.process(("a", 1))
    assert h.advance(9) == [("a", 0, 10, 1)]
    h.process(("a", 2))  # late, but within 5 ms of lateness: the window fires again at once, with both
    assert h.out[-1] == ("a", 0, 10, 2)
    assert h.advance(13) == []
    h.process(("a", 3))
    assert h.out[-1] == ("a", 0, 10, 3)
    assert h.advance(14) == []  # 9 + 5: the window's state is dropped
    assert h.op.state.snapshot() == {}
    h.process(("a", 4))
    assert h.late == [("a", 4)] and h.op.late_records == 1
    assert len(h.out) == 3


def test_without_lateness_a_record_behind_its_windows_end_is_late():
    h = Harness(SlidingEventTimeWindows.of(10, 5), AggregateFunction(lambda: 0, lambda n, r: n + 1))
    h.advance(9)
    h.process(("a", 7))  # windows [0, 10) ended, [5, 15) not yet: it counts there only
    assert h.late == []
    assert h.advance(14) == [("a", 5, 15, 1)]
    h.process(("a", 3))  # [-5, 5) and [0, 10) both ended
    assert h.late == [("a", 3)]


def test_session_windows_merge_records_closer_than_the_gap():
    h = Harness(EventTimeSessionWindows.with_gap(10), AggregateFunction(lambda: 0, lambda n, r: n + 1, operator.add))
    for r in [("a", 0), ("a", 25), ("a", 10), ("b", 3), ("a", 17)]:
        h.process(r)  # a: 0 and 10 touch, 17 joins, 25 is 8 after 17: one session [0, 35)
    assert h.advance(34) == [("b", 3, 13, 1), ("a", 0, 35, 4)]
    assert h.op.timers.next_event_time() is None  # the merged windows' timers went with them


def test_a_late_record_that_would_join_a_session_still_open_is_not_late():
    h = Harness(EventTimeSessionWindows.with_gap(10), AggregateFunction(lambda: 0, lambda n, r: n + 1, operator.add))
    h.process(("a", 20))
    h.advance(15)
    h.process(("a", 12))  # alone its session [12, 22) ended at 21 > 15: on time, merges into [12, 30)
    assert h.late == []
    assert h.advance(29) == [("a", 12, 30, 2)]
    h.process(("a", 1))
    assert h.late == [("a", 1)]


def test_window_state_and_timers_live_by_key_group():
    h = Harness(TumblingEventTimeWindows.of(10), AggregateFunction(lambda: 0, lambda n, r: n + 1))
    for i in range(20):
        h.process((f"k{i}", i))
    snap = pickle.loads(pickle.dumps(h.op.snapshot(1)))  # as the chain stores it
    assert set(snap["keyed"]) == set(snap["timers"]["event"])
    other = Harness(TumblingEventTimeWindows.of(10), AggregateFunction(lambda: 0, lambda n, r: n + 1))
    other.op.restore(snap)
    other.op.timers.restored(other.op.timers.watermark)
    assert sorted(other.advance(20)) == sorted(h.advance(20))


def test_a_window_operator_ignores_processing_time_timers():
    h = Harness(TumblingEventTimeWindows.of(10), AggregateFunction(lambda: 0, lambda n, r: n + 1))
    h.process(("a", 1))
    h.op.on_timer("processing", 9, "a", TimeWindow(0, 10))
    assert h.out == []
    h.op.on_timer(EVENT_TIME, 9, "a", TimeWindow(0, 10))
    assert h.out == [("a", 0, 10, 1)]


def test_assigners_refuse_sizes_that_cannot_work():
    with pytest.raises(ValueError):
        TumblingEventTimeWindows.of(0)
    with pytest.raises(ValueError):
        SlidingEventTimeWindows.of(10, 0)
    with pytest.raises(ValueError):
        EventTimeSessionWindows.with_gap(-1)
