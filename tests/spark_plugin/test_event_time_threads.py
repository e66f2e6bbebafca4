"""Event time across subtasks over real sockets (every subtask a thread, an in-memory coordinator): an idle source
partition, a restore from an unaligned checkpoint whose in-flight data holds watermarks and late records, and a
rescaled restore of window state and timers.

The failure-free run of the same pipeline is the reference: with one source subtask each window subtask has one
input channel, so with watermarks sent after every record that advances them, which records are late is a function
of the input alone.
"""

from __future__ import annotations

import pickle
import time
from collections import Counter

import pytest

from contract.events import JobStatusChanged
from spark_plugin import Pipeline
from spark_plugin.api.watermarks import MIN_WATERMARK, WatermarkStrategy
from spark_plugin.api.windows import TumblingEventTimeWindows
from spark_plugin.connectors import CollectSink
from spark_plugin.connectors.event_sequence import EventSequenceSource
from spark_plugin.network.config import NetworkConfig
from spark_plugin.network.elements import is_marker
from spark_plugin.task.channel_state import ChannelStateReader
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.fakes import InMemoryCoordinator, sample_until
from tests.spark_plugin.test_rescale_threads import rescale_plan
from tests.spark_plugin.test_restore_threads import plan_from_acks
from tests.spark_plugin.test_subtask_threads import wait_for

SMALL = NetworkConfig(buffer_size=512)
DEEP = NetworkConfig(buffer_size=512, exclusive_buffers_per_channel=16)
"""Receivers with room for several buffers per channel: senders hold no more than their credit plus one, so this is
what keeps a few watermark changes (one per 500 ms bucket of event time) in flight at a checkpoint."""
WINDOW = 1000
LATENESS = 500
BUCKET = 500


def coarse_ts(r):
    """The source's view of event time: whole 500 ms buckets, so its watermark moves (and a watermark goes out)
    only every few dozen records, deterministically."""
    return r[1] - r[1] % BUCKET


def ts(r):
    return r[1]


def key(r):
    return r[0]


def zero():
    return (0, 0)


def slow_add(acc, r):
    time.sleep(0.0002)  # the window stage is the slow one: its inputs back up, so data is in flight
    return (acc[0] + 1, acc[1] + r[3])


def merge(a, b):
    return (a[0] + b[0], a[1] + b[1])


def events(count: int, late: bool) -> EventSequenceSource:
    return EventSequenceSource(count=count, partitions=3, keys=20, skew=1.0, interval_ms=10, disorder_ms=40,
                               late_every=3 if late else 0, late_ms=1000)


def windowed_pipeline(count: int, late: bool, source_parallelism: int = 1) -> Pipeline:
    """events -> key_by -> 1 s windows (500 ms lateness) counting and summing -> results; late records apart."""
    p = Pipeline("windows", parallelism=2)
    strategy = WatermarkStrategy(coarse_ts, max_out_of_orderness=50, interval=0)
    windowed = (
        p.source(events(count, late), id="src", parallelism=source_parallelism, watermarks=strategy)
        .key_by(key)
        .window(TumblingEventTimeWindows.of(WINDOW), allowed_lateness=LATENESS, timestamp=ts)
        .aggregate(zero, slow_add, merge=merge, id="win")
    )
    windowed.sink(CollectSink(), id="out")
    if late:
        windowed.late_records().sink(CollectSink(), id="late")
    return p


def collected(results, sink_id: str) -> list:
    return sorted(r for res in results for k, o in res.outputs.items() if k == sink_id for r in o["records"])


def expected_windows(src: EventSequenceSource) -> list:
    """What windows without late data must emit: a count and a sum of ``n`` per key and window."""
    acc: Counter = Counter()
    total: Counter = Counter()
    for k, t, _q, n in src.all_records():
        start = t - t % WINDOW
        acc[(k, start, start + WINDOW)] += 1
        total[(k, start, start + WINDOW)] += n
    return sorted((k, s, e, (acc[(k, s, e)], total[(k, s, e)])) for k, s, e in acc)


def run_to_end(p: Pipeline, **restore) -> tuple[ThreadedRun, list]:
    coord = InMemoryCoordinator()
    run = ThreadedRun(p, coord.reporter, coord.events, SMALL, **restore).start()
    return run, run.join(120)


def checkpoint_mid_stream(p: Pipeline, subtasks: int) -> tuple[InMemoryCoordinator, ThreadedRun]:
    """Run until the windows took some records, take unaligned checkpoint 1, and stop there (as a failure would)."""
    coord = InMemoryCoordinator()
    run = ThreadedRun(p, coord.reporter, coord.events, DEEP).start()
    wait_for(lambda: sum(st.records_in for st in run.subtasks if st.spec.vertex == "win") > 400, "records to flow")
    coord.trigger(1, "unaligned")
    wait_for(lambda: len(coord.acks.get(1, {})) == subtasks, "checkpoint 1")
    coord.publish(JobStatusChanged(status="CANCELLED"))
    run.join(60)
    return coord, run


def fetcher(coord: InMemoryCoordinator, transform=None):
    def fetch(blob_id, start, end):
        data = coord.blobs[blob_id]
        if transform is not None and blob_id.endswith("-operator"):
            data = transform(data)
        return data if start is None else data[start : end + 1]

    return fetch


def in_flight(coord: InMemoryCoordinator, vertex: str) -> dict[int, list]:
    """The persisted input of ``vertex``'s subtasks in checkpoint 1, as records and markers in channel order."""
    out = {}
    for (v, i), ack in coord.acks[1].items():
        if v == vertex and ack.get("channel_state"):
            reader = ChannelStateReader(coord.blobs[ack["channel_state"]["blob_id"]])
            segs = [s for s in ack["channel_segments"] if s["direction"] == "input"]
            out[i] = [e for s in segs for e in reader.segment_records(s)]
    return out


# ====================================================================================== idle partitions


def idle_partition_pipeline(idleness: bool) -> tuple[Pipeline, EventSequenceSource]:
    """Two source subtasks; partition 3 (read by subtask 1) never sends anything."""
    src = EventSequenceSource(count=None, partitions=4, keys=10, interval_ms=1, disorder_ms=20, idle=[3], rate=2000)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(20, ts).with_interval(50)
    if idleness:
        strategy = strategy.with_idleness(300)
    p = Pipeline("idle", parallelism=2)
    (
        p.source(src, id="src", watermarks=strategy)
        .key_by(key)
        .window(TumblingEventTimeWindows.of(500))
        .aggregate(lambda: 0, lambda n, r: n + 1, id="win")
        .sink(CollectSink(), id="out")
    )
    return p, src


def test_an_idle_source_partition_does_not_hold_windows_back():
    p, src = idle_partition_pipeline(idleness=True)
    coord = InMemoryCoordinator()
    run = ThreadedRun(p, coord.reporter, coord.events, SMALL).start()
    sinks = [run.subtask("win", i).chain.operators[-1].sink for i in range(2)]

    def fired() -> list:
        return sorted(r for s in sinks for r in list(s.records) if r[2] <= 2000)

    expected: Counter = Counter()
    for q in (0, 1, 2):
        for n in range(2100):
            k, t, _, _ = src.record(q, n)
            if t < 2000:
                expected[(k, t - t % 500, t - t % 500 + 500)] += 1
    want = sorted((k, s, e, c) for (k, s, e), c in expected.items())
    # the source never ends: these windows can only fire because partition 3 went idle
    wait_for(lambda: len(fired()) >= len(want), "the first windows to fire while partition 3 is idle", 60)
    coord.publish(JobStatusChanged(status="CANCELLED"))
    run.join(60)
    assert fired() == want


def slow_count(n, r):
    time.sleep(0.0005)  # the window stage is slow: the source spends most of its time unpolled (backpressure)
    return n + 1


def test_under_backpressure_a_silent_partition_still_goes_idle_and_windows_fire():
    """One source subtask reads partitions 0 and 1; partition 1 never sends. The windows are slow, so the source's
    output is full most of the time and it is rarely polled for long stretches: the silent partition's idle clock
    runs only while the source is read, and must still get there, or no window fires while the source runs."""
    src = EventSequenceSource(count=None, partitions=2, keys=10, interval_ms=1, disorder_ms=20, idle=[1])
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(20, ts).with_interval(50).with_idleness(300)
    p = Pipeline("idle-backpressure", parallelism=1)
    (
        p.source(src, id="src", watermarks=strategy)
        .key_by(key)
        .window(TumblingEventTimeWindows.of(500))
        .aggregate(lambda: 0, slow_count, id="win")
        .sink(CollectSink(), id="out")
    )
    coord = InMemoryCoordinator()
    # whole 32 KiB buffers (about a thousand records) take the windows a while each: credits come back in bursts,
    # and between them the source is not polled for many watermark intervals in a row
    run = ThreadedRun(p, coord.reporter, coord.events, NetworkConfig()).start()
    sink = run.subtask("win", 0).chain.operators[-1].sink
    source = run.subtask("src", 0)
    # the source never ends: a window can only fire because partition 1 went idle
    wait_for(lambda: len(sink.records) > 0, "a window to fire while partition 1 sends nothing", 60)
    coord.publish(JobStatusChanged(status="CANCELLED"))
    run.join(60)
    assert source.live.blocked_s > 0, "the source never waited for room in its output: no backpressure"
    k, start, end, count = sorted(sink.records)[0]
    records = [src.record(0, n) for n in range(end + 100)]
    assert count == sum(1 for r in records if r[0] == k and start <= r[1] < end)  # complete: none was late


def test_without_idleness_a_silent_partition_holds_the_watermark_back():
    p, _ = idle_partition_pipeline(idleness=False)
    coord = InMemoryCoordinator()
    run = ThreadedRun(p, coord.reporter, coord.events, SMALL).start()
    wins = [run.subtask("win", i) for i in range(2)]
    wait_for(lambda: sum(w.records_in for w in wins) > 3000, "records to flow")
    assert run.subtask("src", 0).output_watermark is not None  # the other source subtask moves on
    assert run.subtask("src", 1).output_watermark is None  # partition 3 has sent nothing: no watermark at all
    assert [w.watermark for w in wins] == [None, None]
    coord.publish(JobStatusChanged(status="CANCELLED"))
    run.join(60)


# ====================================================================================== unaligned restores


def test_a_restore_from_an_unaligned_checkpoint_judges_every_record_as_the_run_without_failures():
    count = 2000  # enough left to be in flight at the checkpoint
    _, reference = run_to_end(windowed_pipeline(count, late=True))
    ref_out, ref_late = collected(reference, "out"), collected(reference, "late")
    assert ref_late, "the input has records too late for their windows"
    firings = Counter((k, s) for k, s, _, _ in ref_out)
    assert any(n > 1 for n in firings.values()), "the input has records late within the allowed lateness"

    coord = checkpoint_holding(
        lambda: windowed_pipeline(count, late=True), 7,
        lambda c: any(is_marker(e) for records in in_flight(c, "win").values() for e in records),
        "watermark in flight")
    flight = in_flight(coord, "win")
    assert any(is_marker(e) for records in flight.values() for e in records), "no watermark was in flight"
    for (v, _), ack in coord.acks[1].items():
        if v == "win":
            state = pickle.loads(coord.blobs[ack["operator_state"]["blob_id"]])
            assert state["event_time"]["valve"]["watermark"] > MIN_WATERMARK

    _, restored = run_to_end(
        windowed_pipeline(count, late=True), restore=plan_from_acks(coord.acks[1]), fetch=fetcher(coord),
        restore_checkpoint=1,
    )
    assert collected(restored, "out") == ref_out  # no window fired twice, none skipped, nothing lost
    assert collected(restored, "late") == ref_late  # no record judged late that was not, and the reverse


def forget_event_time(blob: bytes) -> bytes:
    """What a restore that regenerates watermarks after the in-flight data (Flink's) starts from."""
    data = pickle.loads(blob)
    data.pop("event_time", None)
    for state in data["operators"].values():
        if isinstance(state, dict) and "timers" in state:
            state["timers"]["watermark"], state["timers"]["floors"] = MIN_WATERMARK, {}
    return pickle.dumps(data)


def late_beyond_lateness_ahead_of_the_first_watermark(coord: InMemoryCoordinator) -> list:
    """The records in flight to the windows, ahead of their channel's first watermark, whose window (with its
    lateness) the stored watermark has already closed: a restore that forgot that watermark would take them in."""
    stored = {}
    for (v, i), ack in coord.acks[1].items():
        if v == "win":
            stored[i] = pickle.loads(coord.blobs[ack["operator_state"]["blob_id"]])["event_time"]["valve"]["watermark"]
    before_first_watermark = []
    for i, records in in_flight(coord, "win").items():
        for e in records:
            if is_marker(e):
                break
            before_first_watermark.append((e, stored[i]))
    return [r for r, wm in before_first_watermark if r[1] - r[1] % WINDOW + WINDOW - 1 + LATENESS <= wm]


def checkpoint_holding(p_factory, subtasks: int, holds, what: str, tries: int = 5):
    """``checkpoint_mid_stream`` until its checkpoint holds what the test needs in flight (``sample_until``)."""

    def why_not(coord):
        if holds(coord):
            return None
        return f"{sum(len(r) for r in in_flight(coord, 'win').values())} elements in flight to the windows"

    return sample_until(lambda: checkpoint_mid_stream(p_factory(), subtasks=subtasks)[0], why_not, what, tries)


def test_a_restore_that_forgot_the_watermarks_would_let_late_records_in_flight_fire_their_windows_again():
    """The control for the test above: it fails when the restore does not bring the watermarks back."""
    count = 2000  # enough left to be in flight at the checkpoint
    coord = checkpoint_holding(lambda: windowed_pipeline(count, late=True), 7,
                               late_beyond_lateness_ahead_of_the_first_watermark,
                               "record beyond the lateness in flight ahead of the first watermark")
    beyond = late_beyond_lateness_ahead_of_the_first_watermark(coord)

    _, exact = run_to_end(windowed_pipeline(count, late=True), restore=plan_from_acks(coord.acks[1]),
                          fetch=fetcher(coord), restore_checkpoint=1)
    _, forgot = run_to_end(windowed_pipeline(count, late=True), restore=plan_from_acks(coord.acks[1]),
                           fetch=fetcher(coord, forget_event_time), restore_checkpoint=1)
    late_exact, late_forgot = collected(exact, "late"), collected(forgot, "late")
    assert all(r in late_exact for r in beyond) and not any(r in late_forgot for r in beyond)
    assert collected(forgot, "out") != collected(exact, "out")  # they fired windows that had fired and gone


@pytest.mark.parametrize("new_parallelism", [3, 1])
def test_a_rescaled_restore_of_window_state_and_timers_fires_every_window_once_with_all_its_records(new_parallelism):
    count = 2000  # enough left to be in flight at the checkpoint
    src = events(count, late=False)
    want = expected_windows(src)
    coord = checkpoint_holding(lambda: windowed_pipeline(count, late=False, source_parallelism=2), 4,
                               lambda c: any(in_flight(c, "win").values()), "record in flight to the windows")
    old = plan_from_acks(coord.acks[1])
    pending = sum(
        len(t)
        for (v, _), part in old.items() if v == "win"
        for ref in part["operator_state"]
        for t in pickle.loads(coord.blobs[ref["blob_id"]])["operators"]["win"]["timers"]["event"].values()
    )
    assert pending > 0, "the checkpoint holds no pending window: nothing to rescale"
    assert any(p["input_channel_state"] for k, p in old.items() if k[0] == "win")

    pipeline = windowed_pipeline(count, late=False, source_parallelism=2)
    for node in pipeline.nodes:
        if node.op.id in ("win", "out"):
            node.op.parallelism = new_parallelism
    run, results = run_to_end(
        pipeline, restore=rescale_plan(coord.acks[1], "win", new_parallelism), fetch=fetcher(coord),
        restore_checkpoint=1,
    )
    assert [v.parallelism for v in run.plan.vertices] == [2, new_parallelism]
    assert collected(results, "out") == want


def _nan_for_key_3(r):
    return float("nan") if r[0] == 3 else r[1]


def _with_missing_time(r):
    return (r[0], None if r[0] == 3 else r[1], r[2], r[3])


@pytest.mark.parametrize("bad", ["nan", "none"])
def test_a_record_without_a_usable_event_time_fails_the_source_naming_it_instead_of_being_lost(bad):
    # NaN compared false everywhere: its window never fired and held back the windows after it; None failed a
    # comparison deep in the watermark generator
    timestamp = _nan_for_key_3 if bad == "nan" else (lambda r: _with_missing_time(r)[1])
    p = Pipeline("bad-time", parallelism=1)
    (
        p.source(events(200, late=False), id="src", watermarks=WatermarkStrategy(timestamp, 50, interval=0))
        .key_by(key)
        .window(TumblingEventTimeWindows.of(WINDOW))
        .aggregate(zero, slow_add, merge=merge, id="win")
        .sink(CollectSink(), id="out")
    )
    with pytest.raises(ValueError, match=r"source 'src': the event time of record \(3, .* must be a finite number"):
        run_to_end(p)


def test_a_window_whose_own_timestamp_is_not_a_number_fails_naming_the_window_operator():
    p = Pipeline("bad-window-time", parallelism=1)
    (
        p.source(events(200, late=False), id="src", watermarks=WatermarkStrategy(coarse_ts, 50, interval=0))
        .map(_with_missing_time, id="drop-time")
        .key_by(key)
        .window(TumblingEventTimeWindows.of(WINDOW), timestamp=ts)
        .aggregate(zero, slow_add, merge=merge, id="win")
        .sink(CollectSink(), id="out")
    )
    with pytest.raises(ValueError, match=r"window operator 'win': the event time of record \(3, None"):
        run_to_end(p)
