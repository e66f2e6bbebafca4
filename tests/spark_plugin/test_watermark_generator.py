"""A source's watermarks: bounded out-of-orderness per partition, the minimum over partitions, idleness; and the
generated event source the event-time tests read."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest

from spark_plugin.api.watermarks import MIN_WATERMARK, ColumnTime, PartitionWatermarks, WatermarkStrategy
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


def test_partitions_that_go_idle_in_the_same_check_let_the_watermark_reach_the_highest_they_read():
    """A split that never sends and one read to its end in less than a check go idle together: nothing holds the
    watermark back then, so it reaches what was read (or a job whose input pauses never fires its windows)."""
    gen = PartitionWatermarks(WatermarkStrategy(ts, 10, idle_timeout=1000), ["read", "empty"], now_ms=0)
    gen.on_record(5000, "read", 0)
    gen.on_record(4000, "read", 0)
    gen.tick(500)  # "read" sent in this interval, "empty" did not
    assert gen.current() == MIN_WATERMARK and not gen.idle  # the empty split holds it back while it is not idle
    gen.tick(1500)  # "read": 1000 ms without a record, "empty": 1500: both idle in this check
    assert gen.idle and gen.current() == 5000 - 11


def test_the_watermark_of_a_source_whose_partitions_are_idle_before_any_record_is_none_yet():
    gen = PartitionWatermarks(WatermarkStrategy(ts, 0, idle_timeout=1000), ["a", "b"], now_ms=0)
    gen.tick(1000)
    assert gen.idle and gen.current() == MIN_WATERMARK


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
    assert src.partitions() == ["1", "3"]  # its splits
    first = src.poll(7) + src.poll(7) + src.poll(7)
    assert [r[2] for r in first] == [1] * 7 + [3] * 7 + [1] * 7  # a batch of each in turn
    offsets = src.offsets()
    rest = src.poll(1000) + src.poll(1000)
    assert len(first) + len(rest) == 100 and src.poll(10) is None
    again = EventSequenceSource(count=50, partitions=5, keys=7, disorder_ms=30, speeds=[1, 1, 2, 3, 5],
                                late_every=10, late_ms=500)
    again.open(1, 2)
    again.seek(offsets)
    assert again.poll(1000) + again.poll(1000) == rest  # the same records in the same order
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
    assert src.partitions() == ["0", "1"]
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


def test_under_backpressure_a_silent_partition_goes_idle_once_it_was_read_for_the_idle_timeout():
    """Every fifth check finds the source unpolled (backpressure): that pauses the silent partition's clock, it does
    not restart it, so the partition goes idle after 1.8 s instead of never."""
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(2000, timestamp=lambda r: r).with_idleness(1500)
    gen = PartitionWatermarks(strategy, ["busy", "empty"], now_ms=0)
    idle_at = None
    for i in range(1, 101):
        gen.on_record(i * 200 + 10_000, "busy", i * 200)
        gen.tick(i * 200, asked=i % 5 != 0)
        if idle_at is None and gen.parts["empty"].idle:
            idle_at = i * 200
    assert idle_at == 1800  # 1500 ms of reading at least: 8 polled intervals of 200 ms, and 1 unpolled
    assert gen.current() == 100 * 200 + 10_000 - 2001  # the busy partition alone rules


def test_a_silent_partition_paused_by_backpressure_goes_on_where_it_stopped():
    gen = PartitionWatermarks(WatermarkStrategy(ts, 0, idle_timeout=1000), ["a"], now_ms=0)
    gen.tick(600, asked=True)  # 600 ms of reading, nothing came
    gen.tick(5000, asked=False)  # unpolled: paused
    assert not gen.idle
    gen.tick(5300, asked=True)
    assert not gen.idle
    gen.tick(5400, asked=True)  # 600 + 300 + 100 ms of reading
    assert gen.idle


def test_the_event_source_resumes_its_partitions_at_another_parallelism():
    old = [EventSequenceSource(count=20, partitions=4) for _ in range(2)]
    for i, src in enumerate(old):
        src.open(i, 2)
        src.poll(3), src.poll(3), src.poll(3)  # partitions i and i + 2 read 6 and 3 records
    positions = [src.offsets() for src in old]
    new = EventSequenceSource(count=20, partitions=4)
    new.open(0, 1)
    new.restore_positions(positions)
    rest = [r for _ in range(4) for r in new.poll(1000)]
    assert len(rest) == 4 * 20 - 18 and new.poll(1) is None
    for q in range(4):
        assert [r[3] for r in rest if r[2] == q] == list(range(6 if q < 2 else 3, 20))


def test_offsets_of_the_event_source_from_before_splits_still_restore():
    new = EventSequenceSource(count=20, partitions=4)
    new.open(1, 2)
    new.restore_positions([{"next": {"0": 5, "2": 20}}, {"next": {"1": 7, "3": 3}}])  # partition 2 had ended
    assert new.partitions() == ["1", "3"]
    rest = [r for _ in range(2) for r in new.poll(1000)]
    assert [(r[2], r[3]) for r in rest] == [(1, n) for n in range(7, 20)] + [(3, n) for n in range(3, 20)]


# ====================================================================================== a time column


def test_a_strategy_naming_a_column_takes_a_batchs_largest_time_and_a_rows_own():
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(50, timestamp="ts")
    assert strategy.timestamp == ColumnTime("ts")
    batch = pa.RecordBatch.from_pylist([{"ts": 30}, {"ts": None}, {"ts": 70}, {"ts": 10}])
    assert strategy.timestamp(batch) == 70
    assert strategy.timestamp({"ts": 12, "v": 1}) == 12
    assert strategy.timestamp(batch.slice(0, 0)) is None  # an empty batch has no event time


def test_a_timestamp_column_is_read_as_epoch_milliseconds():
    at = datetime.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.timezone.utc)
    batch = pa.RecordBatch.from_pydict({"ts": pa.array([at], pa.timestamp("us", tz="UTC"))})
    assert ColumnTime("ts")(batch) == int(at.timestamp() * 1000)


def test_a_time_column_of_another_type_or_missing_says_which_and_what_to_do():
    with pytest.raises(ValueError, match="'ts' is of type string.*map_batches"):
        ColumnTime("ts")(pa.RecordBatch.from_pydict({"ts": ["10"]}))
    with pytest.raises(KeyError, match="'ts' is not in the batch"):
        ColumnTime("ts")(pa.RecordBatch.from_pydict({"t": [10]}))


def test_a_partition_read_to_its_end_holds_the_watermark_back_no_more():
    """A finished split never sends again: it must not hold the watermark at its last record's time, with or
    without an idle timeout (a source that discovers new files goes on reading the others)."""
    gen = PartitionWatermarks(WatermarkStrategy(ts, 0), ["short", "long"], now_ms=0)
    gen.on_record(1_000, "short", 0)
    gen.on_record(50_000, "long", 0)
    gen.tick(60_000)
    assert gen.current() == 999  # no idle timeout: the short file rules for ever
    gen.finished(["short"])
    assert gen.current() == 49_999 and not gen.idle
    gen.on_record(70_000, "long", 60_001)
    assert gen.current() == 69_999


def test_a_file_source_names_the_files_it_read_through_so_their_watermark_lets_go(tmp_path):
    from spark_plugin.connectors import JsonLinesSource

    (tmp_path / "a.jsonl").write_text("".join(f'{{"t": {t}}}\n' for t in range(0, 1_000, 100)))
    (tmp_path / "b.jsonl").write_text("".join(f'{{"t": {t}}}\n' for t in range(0, 100_000, 100)))
    source = JsonLinesSource(str(tmp_path), discovery_interval=60.0)  # never ends: it may find more files
    source.open(0, 1)
    try:
        gen = PartitionWatermarks(WatermarkStrategy(lambda r: r["t"], 0), source.partitions(), now_ms=0)
        while not source.finished_partitions():
            for record in source.poll(100) or []:
                gen.on_record(record["t"], source.partition_of(record), 0)
        (done,) = source.finished_partitions()
        assert done.endswith("a.jsonl")
        held = gen.current()
        gen.finished(source.finished_partitions())
        assert gen.current() > held and gen.current() == gen.parts[source.partitions()[1]].max_ts - 1
    finally:
        source.close()
