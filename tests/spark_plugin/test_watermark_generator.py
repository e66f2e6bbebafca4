"""A source's watermarks: bounded out-of-orderness per partition, the minimum over partitions, idleness; and the
generated event source the event-time tests read."""

from __future__ import annotations

import pytest

from spark_plugin.api.watermarks import MIN_WATERMARK, PartitionWatermarks, WatermarkStrategy
from spark_plugin.connectors.event_sequence import EventSequenceSource


def ts(r):
    return r[1]


def test_the_watermark_trails_the_largest_timestamp_by_the_out_of_orderness():
    gen = PartitionWatermarks(WatermarkStrategy.for_bounded_out_of_orderness(100, ts), [], now_ms=0)
    assert gen.current() == MIN_WATERMARK
    for t in (1000, 1500, 1200):
        gen.on_record(t, None, 0)
    assert gen.current() == 1399  # a record at 1400 is still on time, one at 1399 is late


def test_each_partition_holds_the_watermark_back_until_it_sent_and_the_slowest_rules():
    gen = PartitionWatermarks(WatermarkStrategy.for_monotonous_timestamps(ts), ["a", "b"], now_ms=0)
    gen.on_record(5000, "a", 0)
    assert gen.current() == MIN_WATERMARK  # b has sent nothing
    gen.on_record(2000, "b", 0)
    assert gen.current() == 1999  # per-subtask max would say 4999, and make b's next records late
    gen.on_record(9000, "b", 0)
    assert gen.current() == 4999


def test_a_partition_without_records_for_the_idle_timeout_holds_nothing_back_until_it_sends_again():
    gen = PartitionWatermarks(WatermarkStrategy(ts, 0, idle_timeout=1000), ["a", "b"], now_ms=0)
    gen.on_record(5000, "a", 0)
    gen.tick(500)
    gen.tick(999)
    assert gen.current() == MIN_WATERMARK
    gen.on_record(6000, "a", 1000)
    gen.tick(1000)  # b sent nothing for 1000 ms: idle
    assert gen.current() == 5999 and not gen.idle
    assert gen.on_record(3000, "b", 1100) is True  # b is back: it holds the watermark again
    assert gen.current() == 2999
    gen.tick(2200)
    gen.tick(3300)
    assert gen.idle  # neither sent anything since


def test_partition_state_survives_a_restore_and_a_rescale_merges_at_the_lowest():
    strategy = WatermarkStrategy.for_monotonous_timestamps(ts)
    a = PartitionWatermarks(strategy, [0, 2], 0)
    a.on_record(100, 0, 0), a.on_record(300, 2, 0)
    b = PartitionWatermarks(strategy, [1, 3], 0)
    b.on_record(200, 1, 0), b.on_record(50, 3, 0)
    whole = PartitionWatermarks(strategy, [0, 1, 2, 3], 0)
    whole.restore([a.snapshot(), b.snapshot()], 0)
    assert whole.current() == 49
    undeclared = PartitionWatermarks(strategy, [], 0)
    undeclared.restore([a.snapshot(), b.snapshot()], 0)
    assert undeclared.current() == 49  # one stream made of all of them: the lowest bounds it


def test_a_strategy_refuses_what_cannot_work():
    with pytest.raises(ValueError, match="must be a function"):
        WatermarkStrategy(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must not be negative"):
        WatermarkStrategy.for_bounded_out_of_orderness(-1, ts)
    with pytest.raises(ValueError, match="must be positive"):
        WatermarkStrategy.for_monotonous_timestamps(ts).with_idleness(0)


def test_the_event_source_reads_its_partitions_in_turn_out_of_order_within_the_bound_and_replays_identically():
    src = EventSequenceSource(count=50, partitions=5, keys=7, disorder_ms=30, speeds=[1, 1, 2, 3, 5], late_every=10,
                              late_ms=500)
    src.open(1, 2)
    assert src.partitions() == [1, 3]
    first = src.poll(7)
    assert [r[2] for r in first] == [1, 3, 1, 3, 1, 3, 1]
    offsets = src.offsets()
    rest = src.poll(1000)
    assert len(first) + len(rest) == 100 and src.poll(10) is None
    again = EventSequenceSource(count=50, partitions=5, keys=7, disorder_ms=30, speeds=[1, 1, 2, 3, 5],
                                late_every=10, late_ms=500)
    again.open(1, 2)
    again.seek(offsets)
    assert again.poll(1000) == rest
    for q in (1, 3):
        records = [r for r in first + rest if r[2] == q]
        top = MIN_WATERMARK
        for _key, t, _q, n in records:
            if n % 10 != 9:
                assert t >= top - 30, "an on-time record further out of order than the bound"
            top = max(top, t)


def test_the_event_source_keeps_idle_partitions_listed_but_silent():
    src = EventSequenceSource(count=10, partitions=2, idle=[1])
    src.open(0, 1)
    assert src.partitions() == [0, 1]
    records = src.poll(100)
    assert {r[2] for r in records} == {0} and len(records) == 10
    assert src.poll(10) is None
    assert {r[2] for r in src.all_records()} == {0}


def test_a_source_not_asked_for_records_under_backpressure_has_no_idle_partition():
    gen = PartitionWatermarks(WatermarkStrategy(ts, 0, idle_timeout=1000), ["a"], now_ms=0)
    gen.on_record(100, "a", 0)
    for now in range(0, 5000, 200):
        gen.tick(now, asked=False)  # the output had no room: the subtask never polled its source
    assert not gen.idle and gen.current() == 99
    for now in range(5000, 6200, 200):
        gen.tick(now, asked=True)  # polled, and nothing came
    assert gen.idle


def test_the_event_source_resumes_its_partitions_at_another_parallelism():
    old = [EventSequenceSource(count=20, partitions=4) for _ in range(2)]
    for i, src in enumerate(old):
        src.open(i, 2)
        src.poll(6)
    positions = [src.offsets() for src in old]
    new = EventSequenceSource(count=20, partitions=4)
    new.open(0, 1)
    new.restore_positions(positions)
    rest = new.poll(1000)
    assert len(rest) == 4 * 20 - 12 and new.poll(1) is None
    for q in range(4):
        assert [r[3] for r in rest if r[2] == q] == list(range(3, 20))
