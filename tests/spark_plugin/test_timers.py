"""Keyed timers by key group: register, delete, due in timestamp order, checkpointed by key group, and after a
rescale the old watermark of each key group is its floor."""

from __future__ import annotations

from contract.keygroups import key_group, key_group_range
from spark_plugin.api.timers import EVENT_TIME, PROCESSING_TIME, TimerService
from spark_plugin.api.watermarks import MIN_WATERMARK

MAXP = 16


def service(index: int = 0, parallelism: int = 1) -> TimerService:
    return TimerService(MAXP, key_group_range(index, MAXP, parallelism))


def drain(timers: TimerService, now: int = 0) -> list:
    out = []
    while (t := timers.pop_due(now)) is not None:
        out.append(t)
    return out


def test_event_time_timers_are_due_once_the_watermark_reaches_them_in_timestamp_order():
    t = service()
    for key, ts in (("a", 30), ("b", 10), ("c", 20), ("a", 10)):
        t.register_event_time(key, ts)
    assert not t.has_due(0)
    t.advance(20)
    fired = drain(t)
    assert [(ts, key) for _, ts, key, _ in fired] == [(10, "b"), (10, "a"), (20, "c")]  # ties: as registered
    assert t.next_event_time() == 30
    t.advance(100)
    assert drain(t) == [(EVENT_TIME, 30, "a", None)]


def test_a_timer_registered_twice_fires_once_and_a_deleted_one_never():
    t = service()
    t.register_event_time("k", 5, "w")
    t.register_event_time("k", 5, "w")
    t.register_event_time("k", 6, "w")
    t.delete_event_time("k", 6, "w")
    t.delete_event_time("k", 7, "w")  # never registered: nothing happens
    t.advance(10)
    assert drain(t) == [(EVENT_TIME, 5, "k", "w")]


def test_the_watermark_never_goes_back():
    t = service()
    t.advance(50)
    t.advance(10)
    assert t.watermark == 50


def test_processing_time_timers_are_due_by_the_clock():
    t = service()
    t.register_processing_time("k", 1_000)
    t.register_processing_time("j", 2_000)
    assert t.next_processing_time() == 1_000
    assert not t.has_due(999)
    assert drain(t, now=1_500) == [(PROCESSING_TIME, 1_000, "k", None)]
    t.delete_processing_time("j", 2_000)
    assert t.next_processing_time() is None


def test_a_snapshot_holds_timers_by_key_group_and_a_restore_keeps_those_of_its_range():
    old = service()
    keys = [f"key-{i}" for i in range(40)]
    for i, k in enumerate(keys):
        old.register_event_time(k, 1000 + i)
        old.register_processing_time(k, 9_000 + i)
    snap = old.snapshot()
    assert set(snap["event"]) == {key_group(k, MAXP) for k in keys}
    halves = [service(0, 2), service(1, 2)]
    for half in halves:
        half.restore(snap)
        half.restored(MIN_WATERMARK)
        half.advance(10_000)
    fired = [drain(h, now=20_000) for h in halves]
    for half, timers in zip(halves, fired, strict=True):
        lo, hi = half.key_group_range
        assert all(lo <= key_group(key, MAXP) <= hi for _, _, key, _ in timers)
    assert sorted((d, ts, k) for timers in fired for d, ts, k, _ in timers) == sorted(
        [(EVENT_TIME, 1000 + i, k) for i, k in enumerate(keys)] + [(PROCESSING_TIME, 9000 + i, k) for i, k in enumerate(keys)]
    )


def test_after_a_rescale_each_key_group_keeps_its_old_subtasks_watermark_as_a_floor():
    ahead, behind = service(0, 2), service(1, 2)
    k_ahead = next(f"a{i}" for i in range(100) if key_group(f"a{i}", MAXP) <= ahead.key_group_range[1])
    k_behind = next(f"b{i}" for i in range(100) if key_group(f"b{i}", MAXP) >= behind.key_group_range[0])
    ahead.register_event_time(k_ahead, 500)
    ahead.advance(900)  # its timer at 500 is due but was not fired when the checkpoint was taken
    behind.register_event_time(k_behind, 500)
    behind.advance(100)
    merged = service(0, 1)
    merged.restore(ahead.snapshot())
    merged.restore(behind.snapshot())
    merged.restored(100)  # the new subtask's input watermark: the lower of the two
    assert merged.watermark == 100
    assert merged.watermark_of(key_group(k_ahead, MAXP)) == 900  # records of that key group are judged at 900
    assert merged.watermark_of(key_group(k_behind, MAXP)) == 100
    assert drain(merged) == [(EVENT_TIME, 500, k_ahead, None)]  # due under its floor: fires before any input
    merged.advance(600)
    assert drain(merged) == [(EVENT_TIME, 500, k_behind, None)]
    merged.advance(1000)
    assert merged.floors == {}  # the watermark passed every floor
