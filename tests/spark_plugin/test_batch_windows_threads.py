"""Event-time windows over batch streams, every subtask a thread: tumbling and sliding aggregates against a plain
Python computation over the same rows, the lateness rule of the record path, exactly once across a restore and a
rescale of an unaligned checkpoint, and a batch source whose silent split goes idle so windows still fire."""

from __future__ import annotations

import json
import pickle
import time
from collections import defaultdict

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contract.events import JobStatusChanged
from contract.keygroups import key_group
from spark_plugin import CollectSink, ParquetSource, Pipeline, PipelineError
from spark_plugin.api.batch_windows import KeyedBatchWindowAggregate
from spark_plugin.api.batches import SubtaskBatch
from spark_plugin.api.timers import TimedOperator
from spark_plugin.api.watermarks import WatermarkStrategy
from spark_plugin.api.windows import (
    SlidingEventTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
)
from spark_plugin.connectors import JsonLinesSource
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.fakes import InMemoryCoordinator
from tests.spark_plugin.test_rescale_threads import rescale_plan
from tests.spark_plugin.test_restore_threads import SMALL, plan_from_acks
from tests.spark_plugin.test_subtask_threads import wait_for

KEYS = 23
FILES = 4
DISORDER = 50
"""The watermark strategy's bound; the input is out of order by less (at most 34 ms), so no row is late."""
ASSIGNERS = {
    "tumbling": TumblingEventTimeWindows.of(200),
    "sliding": SlidingEventTimeWindows.of(300, 100),
}


def event_time(n: int) -> int:
    """Row ``n`` of a file: 5 ms apart, each up to 39 ms late (so later rows are behind earlier ones by <= 34)."""
    return 5 * n + (n * 7919) % 40


def write_events(directory, rows_per_file: int, files: int = FILES) -> list[dict]:
    """Parquet files of rows ``{"k", "ts", "v"}`` (some ``v`` null); returns every row."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = []
    for f in range(files):
        part = [{"k": f"user-{(n + f) % KEYS}", "ts": event_time(n), "v": None if n % 29 == 0 else (n * 31 + f) % 97}
                for n in range(rows_per_file)]
        pq.write_table(pa.Table.from_pylist(part), directory / f"part-{f}.parquet", row_group_size=250)
        rows += part
    return rows


def expected(rows: list[dict], assigner) -> dict:
    """Per (key, start, end), with the record path's assigner: sum, count, min, max and mean of ``v``."""
    vs: dict = defaultdict(list)
    for r in rows:
        for w in assigner.assign(r["ts"]):
            vs[(r["k"], w.start, w.end)].append(r["v"])
    out = {}
    for win, values in vs.items():
        valid = [v for v in values if v is not None]
        out[win] = {"v_sum": sum(valid) if valid else None, "v_count": len(valid),
                    "v_min": min(valid, default=None), "v_max": max(valid, default=None),
                    "v_mean": sum(valid) / len(valid) if valid else None}
    return out


def fired(batches) -> dict:
    """The rows of result batches by (key, start, end); a window that fired twice fails here."""
    out: dict = {}
    for b in batches:
        for row in b.to_pylist():
            win = (row.pop("k"), row.pop("window_start"), row.pop("window_end"))
            assert win not in out, f"window {win} fired twice"
            out[win] = row
    return out


def collected(results, sink_id: str = "out") -> list:
    return [b for res in results for k, o in res.outputs.items() if k == sink_id for b in o["records"]]


def slow(batch):
    time.sleep(0.003)  # per fired window: the window stage is slow, its input backs up
    return batch


def window_pipeline(directory, assigner, windows: int = 2, slow_down: bool = False) -> Pipeline:
    p = Pipeline("batch-windows", parallelism=2)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(DISORDER, timestamp="ts").with_interval(0)
    stream = (
        p.source(ParquetSource(str(directory), batch_rows=50, batches=True), id="src", watermarks=strategy)
        .key_by("k")
        .window(assigner)
        .aggregate({"v": ["sum", "count", "min", "max", "mean"]}, id="win", parallelism=windows)
    )
    if slow_down:
        stream = stream.map_batches(slow, id="slow")
    stream.sink(CollectSink(), id="out")
    return p


# ====================================================================================== results


@pytest.mark.parametrize("kind", sorted(ASSIGNERS))
def test_window_aggregates_over_batches_equal_a_plain_python_computation_over_the_rows(tmp_path, kind):
    rows = write_events(tmp_path / "in", 600)
    coord = InMemoryCoordinator()
    run = ThreadedRun(window_pipeline(tmp_path / "in", ASSIGNERS[kind]), coord.reporter, coord.events, SMALL)
    results = run.start().join(60)
    assert fired(collected(results)) == expected(rows, ASSIGNERS[kind])
    windows = [run.subtask("win", i).chain.operators[0] for i in range(2)]
    assert sum(w.late_records for w in windows) == 0
    assert [w.state.groups for w in windows] == [{}, {}], "a fired window's state was kept"


def late_input(path) -> list[dict]:
    """One JSON-lines file: keys a and b, times rising 10 ms a row, every 7th row 400 ms behind, every 11th 900."""
    rows = [{"k": "ab"[n % 2], "ts": 10 * n - (400 if n % 7 == 6 else 900 if n % 11 == 10 else 0), "v": n}
            for n in range(300)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def late_rule(rows: list[dict], batch_rows: int, size: int, lateness: int) -> tuple[list[dict], list[dict]]:
    """The record path's rule, a batch at a time: a row is late when its window ended ``lateness`` ms or more
    before the watermark that the batches before its own made (largest time so far - DISORDER - 1)."""
    on_time, late, wm = [], [], None
    for i in range(0, len(rows), batch_rows):
        part = rows[i : i + batch_rows]
        for r in part:
            end = r["ts"] - r["ts"] % size + size - 1
            (late if wm is not None and end + lateness <= wm else on_time).append(r)
        top = max(r["ts"] for r in part) - DISORDER - 1
        wm = top if wm is None else max(wm, top)
    return on_time, late


@pytest.mark.parametrize("lateness", [0, 300])
def test_late_rows_are_dropped_counted_and_sent_to_late_records_as_on_the_record_path(tmp_path, lateness):
    rows = late_input(tmp_path / "in.jsonl")
    on_time, late = late_rule(rows, 10, 100, lateness)
    assert late and len(on_time) > len(late)
    p = Pipeline("late", parallelism=1)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(DISORDER, timestamp="ts").with_interval(0)
    windowed = (
        p.source(JsonLinesSource(str(tmp_path / "in.jsonl"), batches=True, batch_rows=10), id="src",
                 watermarks=strategy)
        .key_by("k")
        .window(TumblingEventTimeWindows.of(100), allowed_lateness=lateness)
        .aggregate({"v": ["sum", "count"]}, id="win")
    )
    windowed.sink(CollectSink(), id="out")
    windowed.late_records(id="late").sink(CollectSink(), id="late-out")
    coord = InMemoryCoordinator()
    run = ThreadedRun(p, coord.reporter, coord.events, SMALL)
    results = run.start().join(60)
    window = run.subtask("win", 0).chain.operators[0]
    assert window.late_records == len(late)
    assert window.state.groups == {}, "a window's state outlived its allowed lateness"
    assert sorted(r["v"] for b in collected(results, "late-out") for r in b.to_pylist()) == [r["v"] for r in late]
    # the last firing of each window holds all its on-time rows (late firings repeat it, updated)
    last, firings = {}, defaultdict(int)
    for b in collected(results):
        for row in b.to_pylist():
            last[(row["k"], row["window_start"])] = (row["v_sum"], row["v_count"])
            firings[(row["k"], row["window_start"])] += 1
    assert (max(firings.values()) > 1) == (lateness > 0), "rows within the allowed lateness fire their window again"
    want: dict = defaultdict(lambda: (0, 0))
    for r in on_time:
        s, c = want[(r["k"], r["ts"] - r["ts"] % 100)]
        want[(r["k"], r["ts"] - r["ts"] % 100)] = (s + r["v"], c + 1)
    assert last == dict(want)


def test_batch_windows_refuse_a_source_without_watermarks_and_what_is_no_batch_window_before_running(tmp_path):
    p = Pipeline("bad", parallelism=1)
    plain = p.source(ParquetSource(str(tmp_path), batches=True), id="plain").key_by("k")
    with pytest.raises(PipelineError, match="no watermarks"):
        plain.window(TumblingEventTimeWindows.of(100))
    timed = p.source(ParquetSource(str(tmp_path), batches=True), id="timed",
                     watermarks=WatermarkStrategy.for_bounded_out_of_orderness(10, timestamp="ts")).key_by("k")
    with pytest.raises(PipelineError, match="batch windows are TumblingEventTimeWindows.*EventTimeSessionWindows"):
        timed.window(60_000)
    with pytest.raises(PipelineError, match="choose from sum, count, min, max, mean"):
        timed.window(TumblingEventTimeWindows.of(100)).aggregate({"v": "median"})
    by_function = p.source(ParquetSource(str(tmp_path), batches=True), id="by-function",
                           watermarks=WatermarkStrategy.for_bounded_out_of_orderness(10, lambda b: 0)).key_by("k")
    with pytest.raises(PipelineError, match="time column"):
        by_function.window(TumblingEventTimeWindows.of(100))


# ====================================================================================== restore and rescale


@pytest.mark.parametrize("windows_after", [2, 3])
def test_a_restore_of_an_unaligned_checkpoint_of_batch_windows_fires_every_window_once_with_all_its_rows(
        tmp_path, windows_after):
    """Stopped after an unaligned checkpoint taken under backpressure (sub-batches in flight in it), restored at
    the same parallelism or with the windows rescaled 2 -> 3: the results kept in the sink's state plus those of
    the restored run are every window once, with every row."""
    assigner = ASSIGNERS["sliding"]
    rows = write_events(tmp_path / "in", 1500)
    coord = InMemoryCoordinator()
    first = ThreadedRun(window_pipeline(tmp_path / "in", assigner, slow_down=True), coord.reporter, coord.events,
                        SMALL).start()
    wait_for(lambda: first.subtask("win", 0).records_in > 40, "sub-batches to flow")
    coord.trigger(1, "unaligned")
    wait_for(lambda: len(coord.acks.get(1, {})) == 4, "checkpoint 1")
    coord.publish(JobStatusChanged(status="CANCELLED"))
    first.join(60)
    acks = coord.acks[1]
    old = plan_from_acks(acks)
    assert any(p["input_channel_state"] for k, p in old.items() if k[0] == "win"), (
        "no sub-batch in flight in the checkpoint: not an unaligned restore under backpressure"
    )
    plan = old if windows_after == 2 else rescale_plan(acks, "win", windows_after)

    def fetch(blob_id, start, end):
        data = coord.blobs[blob_id]
        return data if start is None else data[start : end + 1]

    second_coord = InMemoryCoordinator()
    second = ThreadedRun(window_pipeline(tmp_path / "in", assigner, windows=windows_after, slow_down=True),
                         second_coord.reporter, second_coord.events, SMALL, restore=plan, fetch=fetch,
                         restore_checkpoint=1)
    results = second.start().join(120)
    assert [v.parallelism for v in second.plan.vertices] == [2, windows_after]
    assert fired(collected(results)) == expected(rows, assigner)


# ====================================================================================== liveness


def idle_split_pipeline(directory, idleness: bool) -> Pipeline:
    """One source subtask reading two files, one of them empty; the source never ends (it looks for new files)."""
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(DISORDER, timestamp="ts").with_interval(50)
    if idleness:
        strategy = strategy.with_idleness(300)
    p = Pipeline("idle-split", parallelism=1)
    (
        p.source(ParquetSource(str(directory), batch_rows=50, batches=True, discovery_interval=0.2), id="src",
                 watermarks=strategy)
        .key_by("k")
        .window(TumblingEventTimeWindows.of(200))
        .aggregate({"v": ["sum", "count", "min", "max", "mean"]}, id="win", parallelism=2)
        .sink(CollectSink(), id="out")
    )
    return p


def with_empty_split(directory) -> list[dict]:
    rows = write_events(directory, 800, files=1)
    pq.write_table(pa.Table.from_pylist(rows[:0], schema=pa.schema([("k", pa.string()), ("ts", pa.int64()),
                                                                     ("v", pa.int64())])),
                   directory / "part-empty.parquet")
    return rows


def test_an_empty_split_of_a_batch_source_goes_idle_and_windows_fire_while_the_source_runs(tmp_path):
    rows = with_empty_split(tmp_path / "in")
    watermark = max(r["ts"] for r in rows) - DISORDER - 1
    want = {w: v for w, v in expected(rows, TumblingEventTimeWindows.of(200)).items() if w[2] - 1 <= watermark}
    coord = InMemoryCoordinator()
    run = ThreadedRun(idle_split_pipeline(tmp_path / "in", idleness=True), coord.reporter, coord.events,
                      SMALL).start()
    sinks = [run.subtask("win", i).chain.operators[-1].sink for i in range(2)]

    def results() -> list:
        return [b for s in sinks for b in list(s.records)]

    # the source never ends: these windows can only fire because the empty split went idle
    wait_for(lambda: sum(b.num_rows for b in results()) >= len(want), "the windows to fire while the source runs", 60)
    coord.publish(JobStatusChanged(status="CANCELLED"))
    run.join(60)
    assert fired(results()) == want


def test_without_idleness_files_read_to_their_end_hold_event_time_back_no_more(tmp_path):
    """Both files (one empty) are read to their end while the source runs on, looking for new files: without an
    idle timeout nothing would ever mark the empty one idle, but a finished split never sends again, so neither
    holds the watermark back and the windows up to what was read fire."""
    rows = with_empty_split(tmp_path / "in")
    watermark = max(r["ts"] for r in rows) - DISORDER - 1
    want = {w: v for w, v in expected(rows, TumblingEventTimeWindows.of(200)).items() if w[2] - 1 <= watermark}
    coord = InMemoryCoordinator()
    run = ThreadedRun(idle_split_pipeline(tmp_path / "in", idleness=False), coord.reporter, coord.events,
                      SMALL).start()
    sinks = [run.subtask("win", i).chain.operators[-1].sink for i in range(2)]
    source = run.subtask("src", 0)

    def results() -> list:
        return [b for s in sinks for b in list(s.records)]

    wait_for(lambda: len(source.chain.source.reading.finished) == 2, "both files to be read to their end")
    wait_for(lambda: sum(b.num_rows for b in results()) >= len(want), "the windows to fire while the source runs", 60)
    coord.publish(JobStatusChanged(status="CANCELLED"))
    run.join(60)
    assert fired(results()) == want


def _window_count(parallelism: int) -> KeyedBatchWindowAggregate:
    op = KeyedBatchWindowAggregate("win", "k", TumblingEventTimeWindows.of(10), "ts", {"v": "count"})
    op.open(0, parallelism, 128)
    op.bind(lambda b: None)
    return op


def test_batch_windows_keep_each_key_of_a_multi_group_sub_batch_in_its_own_key_group():
    op = _window_count(1)
    keys = [f"k{n % 9}" for n in range(90)]
    batch = pa.RecordBatch.from_pydict({"k": keys, "ts": [n % 20 for n in range(90)], "v": [1] * 90})
    assert len({key_group(k, 128) for k in keys}) > 1
    op.bind(lambda b: None)(SubtaskBatch(keys[0], "k", batch))
    got = {(g, w, k): acc[0] for g, wins in op.state.groups.items() for w, ks in wins.items()
           for k, acc in ks.items()}
    want: dict = defaultdict(int)
    for n, k in enumerate(keys):
        want[(key_group(k, 128), (n % 20) // 10 * 10, k)] += 1
    assert got == dict(want)


def test_batch_windows_refuse_a_row_of_a_key_group_their_subtask_does_not_own_and_keep_no_state_of_it():
    op = _window_count(2)  # key groups 0..63
    mine = next(f"k{n}" for n in range(100) if key_group(f"k{n}", 128) < 64)
    other = next(f"k{n}" for n in range(100) if key_group(f"k{n}", 128) >= 64)
    batch = pa.RecordBatch.from_pydict({"k": [mine, other], "ts": [1, 2], "v": [1, 1]})
    with pytest.raises(RuntimeError, match=f"key {other!r} .*another subtask"):
        op.bind(lambda b: None)(SubtaskBatch(mine, "k", batch))
    assert not op.state.groups


def test_a_round_of_timers_sends_one_batch_per_window_with_the_rows_of_every_key_group():
    """A window's timers are one per key group; what they fire goes out as one batch per window when the round of
    timers ends (``timers_fired``), not as one small batch per key group."""
    op = _window_count(1)
    out: list = []
    process = op.bind(out.append)
    keys = [f"k{n % 9}" for n in range(90)]
    process(SubtaskBatch(keys[0], "k", pa.RecordBatch.from_pydict(
        {"k": keys, "ts": [n % 20 for n in range(90)], "v": [1] * 90})))
    groups = {key_group(k, 128) for k in keys}
    assert len(groups) > 1
    op.advance_watermark(100)
    n = 0
    while (timer := op.timers.pop_due(0)) is not None:
        op.on_timer(*timer)
        n += 1
    assert n == 2 * len(groups) and out == [], "timers fired, nothing sent before the round ends"
    op.timers_fired()
    assert [(b.column("window_start")[0].as_py(), b.num_rows) for b in out] == [(0, 9), (10, 9)]
    assert sorted(r["k"] for r in out[0].to_pylist()) == sorted(set(keys))
    want: dict = defaultdict(int)
    for n, k in enumerate(keys):
        want[(k, (n % 20) // 10 * 10)] += 1
    assert {(r["k"], r["window_start"]): r["v_count"] for b in out for r in b.to_pylist()} == dict(want)
    op.timers_fired()
    assert len(out) == 2, "a round sends what it gathered once"


def _snapshot_view(op: KeyedBatchWindowAggregate) -> tuple:
    """What a batch window operator holds: its windows' accumulators and its pending timers, by key group."""
    windows = {(g, w, k): tuple(acc) for g, wins in op.state.groups.items() for w, ks in wins.items()
               for k, acc in ks.items()}
    timers = {g: sorted(t) for g, t in op.timers.event.groups.items()}
    return windows, timers


def _loaded(state, subtask: int = 0, parallelism: int = 1) -> KeyedBatchWindowAggregate:
    op = KeyedBatchWindowAggregate("win", "k", TumblingEventTimeWindows.of(10), "ts",
                                   {"v": ["sum", "count", "mean"]}, allowed_lateness=5)
    op.open(subtask, parallelism, 128)
    op.restore(pickle.loads(pickle.dumps(state, protocol=5)))
    return op


def _as_before(state) -> dict:
    """``state`` as a checkpoint taken while windows were kept as ``TimeWindow`` objects holds it."""
    def window(start):
        return TimeWindow(start, start + 10)
    timers = state["timers"]
    return {**state, "keyed": {g: {window(s): wins for s, wins in group.items()} for g, group in state["keyed"].items()},
            "timers": {**timers, "event": {g: [(ts, k, window(s)) for ts, k, s in t]
                                           for g, t in timers["event"].items()}}}


def test_batch_windows_keep_windows_by_their_start_and_restore_them_and_their_timers_in_any_range():
    """State and timers name a window by its start, an int, not a TimeWindow (pickling one per window and per timer
    made the synchronous phase of a checkpoint of 136,500 open windows 3× slower): a restore at the same
    parallelism or rescaled gets back exactly what was held, and a checkpoint taken with TimeWindow objects still
    restores into the same windows and timers."""
    op = KeyedBatchWindowAggregate("win", "k", TumblingEventTimeWindows.of(10), "ts",
                                   {"v": ["sum", "count", "mean"]}, allowed_lateness=5)
    op.open(0, 1, 128)
    process = op.bind(lambda b: None)
    keys = [f"k{n % 13}" for n in range(400)]
    process(SubtaskBatch(keys[0], "k", pa.RecordBatch.from_pydict(
        {"k": keys, "ts": [n // 4 for n in range(400)], "v": [float(n) if n % 3 else None for n in range(400)]})))
    op.advance_watermark(40)  # windows up to 30..39 fired; their lateness timers are still pending
    while (timer := op.timers.pop_due(0)) is not None:
        op.on_timer(*timer)
    op.timers_fired()
    held = _snapshot_view(op)
    assert held[0] and any(held[1].values())
    assert {type(w) for (_, w, _) in held[0]} == {int}
    assert {type(ns) for t in held[1].values() for (_, _, ns) in t} == {int}
    state = op.snapshot(1)
    assert set(state) == {"chunks", "timer_offsets", "timers", "key_hash"}  # windows, their timers by start
    assert _snapshot_view(_loaded(state)) == held
    plain = TimedOperator.snapshot(op, 1)  # the state as one dict, as checkpoints before hold it
    whole = {"pickled": pickle.dumps(plain, protocol=5)}  # pickled whole by the operator
    old = _as_before(plain)  # windows kept as TimeWindow objects
    assert isinstance(next(iter(next(iter(old["keyed"].values())))), TimeWindow)
    for form in (whole, old):
        assert _snapshot_view(_loaded(form)) == held
    for form in (state, whole, old):
        for i in range(2):  # rescaled: each keeps the key groups of its range
            half = _loaded(form, i, 2)
            lo, hi = half.state.key_group_range
            assert (lo, hi) == (64 * i, 64 * i + 63)
            assert _snapshot_view(half) == ({k: v for k, v in held[0].items() if lo <= k[0] <= hi},
                                            {g: t for g, t in held[1].items() if lo <= g <= hi})


def _feed(op: KeyedBatchWindowAggregate, process, rows: list[tuple[str, int, float]], watermark: int) -> None:
    process(SubtaskBatch(rows[0][0], "k", pa.RecordBatch.from_pylist(
        [{"k": k, "ts": ts, "v": v} for k, ts, v in rows])))
    op.advance_watermark(watermark)
    while (timer := op.timers.pop_due(0)) is not None:
        op.on_timer(*timer)
    op.timers_fired()


@pytest.mark.parametrize("lateness", [0, 15])
def test_a_batch_window_checkpoint_pickles_again_only_the_window_starts_that_changed_and_restores_all(lateness):
    """A checkpoint pickles only the window starts whose windows or timers changed since the last one and keeps
    the others' pickles: after any mix of new rows, late rows, fired windows and dropped ones, every checkpoint
    restores exactly what the operator held when it was taken (its windows and its pending timers), at the same
    parallelism and rescaled."""
    import random

    rng = random.Random(7 + lateness)
    op = KeyedBatchWindowAggregate("win", "k", TumblingEventTimeWindows.of(10), "ts",
                                   {"v": ["sum", "count"]}, allowed_lateness=lateness)
    op.open(0, 1, 128)
    process = op.bind(lambda b: None)
    watermark, repickled = 0, []
    for checkpoint in range(1, 30):
        rows = [(f"k{rng.randrange(40)}", watermark - 20 + rng.randrange(60), float(rng.randrange(9)))
                for _ in range(rng.randrange(1, 80))]
        watermark += rng.randrange(0, 12)
        _feed(op, process, rows, watermark)
        before = dict(op._chunks)
        held = _snapshot_view(op)
        state = op.snapshot(checkpoint)
        repickled.append(sum(1 for s, b in state["chunks"].items() if before.get(s) is not b))
        assert _snapshot_view(_loaded(state)) == held, f"checkpoint {checkpoint}"
        for i in range(2):
            half = _loaded(state, i, 2)
            lo, hi = half.state.key_group_range
            assert _snapshot_view(half) == ({k: v for k, v in held[0].items() if lo <= k[0] <= hi},
                                            {g: t for g, t in held[1].items() if lo <= g <= hi})
    assert any(0 < n < len(op._chunks) for n in repickled[1:]), repickled  # some kept, some pickled again
    assert op.snapshot(30)["chunks"] and op._dirty == set()
    kept = dict(op._chunks)
    op.snapshot(31)
    assert all(op._chunks[s] is b for s, b in kept.items()), "nothing changed: nothing pickled again"
