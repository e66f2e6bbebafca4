"""Session windows over batch streams: the same sessions, aggregates and late rows as the record path's session
windows (and a plain Python computation) on the same rows, exactly once across a restore and a rescale of an
unaligned checkpoint, and the operator driven directly: merges, stale timers, order within a batch, checkpoints."""

from __future__ import annotations

import json
import pickle
import random
import time
from collections import defaultdict

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contract.events import JobStatusChanged
from contract.keygroups import key_group
from spark_plugin import CollectSink, ParquetSource, Pipeline, PipelineError
from spark_plugin.api.batch_sessions import KeyedBatchSessionAggregate
from spark_plugin.api.batches import SubtaskBatch, merge_partial
from spark_plugin.api.watermarks import WatermarkStrategy
from spark_plugin.api.windows import AggregateFunction, EventTimeSessionWindows, WindowOperator, late_tag
from spark_plugin.connectors import JsonLinesSource
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.fakes import InMemoryCoordinator
from tests.spark_plugin.test_batch_windows_threads import DISORDER, collected, fired
from tests.spark_plugin.test_rescale_threads import rescale_plan
from tests.spark_plugin.test_restore_threads import SMALL, plan_from_acks
from tests.spark_plugin.test_subtask_threads import wait_for

KEYS = 7
FILES = 4
AGGS = ["sum", "count", "min", "max", "mean"]


def session_time(n: int) -> int:
    """Row ``n`` of a file: 7 ms apart, a pause of 400 ms every 40 rows, each up to 39 ms late (so a row is behind
    the rows before it by at most 32 ms: less than DISORDER, no row is late)."""
    return 7 * n + 400 * (n // 40) + (n * 7919) % 40


def write_sessions(directory, rows_per_file: int, gap: int) -> list[dict]:
    """Parquet files of rows ``{"k", "ts", "v"}`` (some ``v`` null), 50 rows a batch. Rows 48 and 49 of the first
    file (its first batch) are the key ``bridge`` at ``B - gap - 1`` and ``B``, two sessions; row 50 (its second
    batch) is ``bridge`` at ``B - 1``, which touches both: the three merge. Returns every row."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = []
    for f in range(FILES):
        part = [{"k": f"user-{(n + f) % KEYS}", "ts": session_time(n), "v": None if n % 29 == 0 else (n * 31 + f) % 97}
                for n in range(rows_per_file)]
        if f == 0:
            b = session_time(49)
            for n, ts in ((48, b - gap - 1), (49, b), (50, b - 1)):
                part[n] = {"k": "bridge", "ts": ts, "v": n}
        pq.write_table(pa.Table.from_pylist(part), directory / f"part-{f}.parquet", row_group_size=250)
        rows += part
    return rows


def aggregates(values: list) -> dict:
    valid = [v for v in values if v is not None]
    return {"v_sum": sum(valid) if valid else None, "v_count": len(valid), "v_min": min(valid, default=None),
            "v_max": max(valid, default=None), "v_mean": sum(valid) / len(valid) if valid else None}


def expected_sessions(rows: list[dict], gap: int) -> dict:
    """Per key, its rows by time cut where two consecutive times are more than ``gap`` apart: ``(key, first, last +
    gap)`` to the aggregates of ``v``."""
    by_key: dict = defaultdict(list)
    for r in rows:
        by_key[r["k"]].append((r["ts"], r["v"]))
    out = {}
    for k, rs in by_key.items():
        rs.sort(key=lambda x: x[0])
        start, values = rs[0][0], [rs[0][1]]
        for (prev, _), (t, v) in zip(rs[:-1], rs[1:], strict=True):
            if t - prev > gap:
                out[(k, start, prev + gap)] = aggregates(values)
                start, values = t, []
            values.append(v)
        out[(k, start, rs[-1][0] + gap)] = aggregates(values)
    return out


# ------------------------------------------------------------------ the record path's aggregate, for comparison


def zero() -> list:
    return [None, 0, None, None]


PARTIALS = ("sum", "count", "min", "max")


def add(acc: list, r: dict) -> list:
    v = r["v"]
    return merge(acc, [v, 0 if v is None else 1, v, v])


def merge(a: list, b: list) -> list:
    return [merge_partial(p, x, y) for p, x, y in zip(PARTIALS, a, b, strict=True)]


def result(acc: list) -> dict:
    s, n, lo, hi = acc
    return {"v_sum": s, "v_count": n, "v_min": lo, "v_max": hi, "v_mean": s / n if n else None}


def record_results(records) -> dict:
    """The record path's ``(key, start, end, aggregates)`` by (key, start, end); a session that fired twice fails."""
    out: dict = {}
    for k, s, e, aggs in records:
        assert (k, s, e) not in out, f"session {(k, s, e)} fired twice"
        out[(k, s, e)] = aggs
    return out


def slow(batch):
    time.sleep(0.01)  # per round of fired sessions: the session stage is slow, its input backs up
    return batch


def session_pipeline(directory, gap: int, windows: int = 2, records: bool = False, slow_down: bool = False):
    """Batches keyed by ``k`` into session aggregates of ``v``, or (``records``) the same rows as records into the
    record path's session windows."""
    p = Pipeline("batch-sessions", parallelism=2)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(DISORDER, timestamp="ts").with_interval(0)
    source = p.source(ParquetSource(str(directory), batch_rows=50, batches=True), id="src", watermarks=strategy)
    if records:
        stream = (source.rows(id="rows").key_by(lambda r: r["k"])
                  .window(EventTimeSessionWindows.with_gap(gap), timestamp=lambda r: r["ts"])
                  .aggregate(zero, add, merge=merge, result=result, id="win", parallelism=windows))
    else:
        stream = (source.key_by("k").window(EventTimeSessionWindows.with_gap(gap))
                  .aggregate({"v": AGGS}, id="win", parallelism=windows))
    if slow_down:
        stream = stream.map_batches(slow, id="slow")
    stream.sink(CollectSink(), id="out")
    return p


# ====================================================================================== results


@pytest.mark.parametrize("gap", [15, 50, 300])
def test_session_aggregates_over_batches_equal_the_record_paths_sessions_and_a_plain_python_computation(
        tmp_path, gap):
    rows = write_sessions(tmp_path / "in", 600, gap)
    want = expected_sessions(rows, gap)
    b = session_time(49)
    assert want[("bridge", b - gap - 1, b + gap)]["v_count"] == 3  # the two sessions and the row between: one
    assert len(want) > 2 * KEYS
    coord = InMemoryCoordinator()
    run = ThreadedRun(session_pipeline(tmp_path / "in", gap), coord.reporter, coord.events, SMALL)
    batches = run.start().join(60)
    assert fired(collected(batches)) == want
    sessions = [run.subtask("win", i).chain.operators[0] for i in range(2)]
    assert sum(s.late_records for s in sessions) == 0
    assert [s.state.groups for s in sessions] == [{}, {}], "a fired session's state was kept"
    assert [dict(s.timers.event.groups) for s in sessions] == [{}, {}], "a merged session's timers were kept"
    coord = InMemoryCoordinator()
    records = ThreadedRun(session_pipeline(tmp_path / "in", gap, records=True), coord.reporter, coord.events, SMALL)
    assert record_results(collected(records.start().join(60))) == want


def late_input(path, batch_rows: int) -> list[dict]:
    """One JSON-lines file: keys a and b, times rising 10 ms a row with a pause of 300 ms every 25 rows; every 7th
    row 400 ms behind, every 11th 900, every 5th 150 (its own session gone, within the one still open)."""
    rows = []
    for n in range(300):
        ts = 10 * n + 300 * (n // 25)
        ts -= 400 if n % 7 == 6 else 900 if n % 11 == 10 else 150 if n % 5 == 4 else 0
        rows.append({"k": "ab"[n % 2], "ts": ts, "v": n})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def session_rule(rows: list[dict], batch_rows: int, gap: int, lateness: int) -> tuple[dict, list, int]:
    """The record path's rule, a batch at a time, the watermark that of the batches before (largest time so far -
    DISORDER - 1): a row is late when the session it makes with every open session of its key it touches ended
    ``lateness`` ms or more before the watermark; a session is dropped once the watermark passes its end - 1 +
    ``lateness``. Returns the sessions as they were dropped (``(key, start, end)`` to their values), the late rows,
    and how many rows were not late only because they joined an open session."""
    open_: dict = defaultdict(dict)
    final, late, rescued, wm = {}, [], 0, None
    for i in range(0, len(rows), batch_rows):
        part = rows[i : i + batch_rows]
        for r in part:
            k, t = r["k"], r["ts"]
            absorbed = [w for w in open_[k] if w[0] <= t + gap and t <= w[1]]
            start, end = min([t, *(w[0] for w in absorbed)]), max([t + gap, *(w[1] for w in absorbed)])
            if wm is not None and end - 1 + lateness <= wm:
                late.append(r)
                continue
            rescued += wm is not None and t + gap - 1 + lateness <= wm
            values = [r["v"]]
            for w in absorbed:
                values += open_[k].pop(w)
            open_[k][(start, end)] = values
        top = max(r["ts"] for r in part) - DISORDER - 1
        wm = top if wm is None else max(wm, top)
        for k, sessions in open_.items():
            for w in [w for w in sessions if w[1] - 1 + lateness <= wm]:
                final[(k, *w)] = sessions.pop(w)
    for k, sessions in open_.items():
        final.update({(k, *w): values for w, values in sessions.items()})
    return final, late, rescued


def last_sessions(emitted: list[tuple]) -> dict:
    """The last firing of each ``(key, start, end)``, without those a later firing of a bigger session of the key
    replaced (a late row merged them): what the sessions finally were."""
    last = {(k, s, e): aggs for k, s, e, aggs in emitted}
    return {w: aggs for w, aggs in last.items()
            if not any(o != w and o[0] == w[0] and o[1] <= w[1] and w[2] <= o[2] for o in last)}


@pytest.mark.parametrize("lateness", [0, 300])
def test_late_rows_of_sessions_over_batches_are_those_of_the_record_path_and_a_late_merge_fires_again(
        tmp_path, lateness):
    gap, batch_rows = 30, 10
    rows = late_input(tmp_path / "in.jsonl", batch_rows)
    final, late, rescued = session_rule(rows, batch_rows, gap, lateness)
    assert late and len(rows) > 2 * len(late) and rescued, "late rows, and rows only an open session keeps"
    want = {w: {"v_sum": sum(values), "v_count": len(values)} for w, values in final.items()}
    emitted, late_rows, counted = {}, {}, {}
    for records in (False, True):
        p = Pipeline("late-sessions", parallelism=1)
        strategy = WatermarkStrategy.for_bounded_out_of_orderness(DISORDER, timestamp="ts").with_interval(0)
        source = p.source(JsonLinesSource(str(tmp_path / "in.jsonl"), batches=True, batch_rows=batch_rows),
                          id="src", watermarks=strategy)
        if records:
            windowed = (source.rows(id="rows").key_by(lambda r: r["k"])
                        .window(EventTimeSessionWindows.with_gap(gap), allowed_lateness=lateness,
                                timestamp=lambda r: r["ts"])
                        .aggregate(lambda: (0, 0), lambda acc, r: (acc[0] + r["v"], acc[1] + 1),
                                   merge=lambda a, b: (a[0] + b[0], a[1] + b[1]),
                                   result=lambda acc: {"v_sum": acc[0], "v_count": acc[1]}, id="win"))
        else:
            windowed = (source.key_by("k").window(EventTimeSessionWindows.with_gap(gap), allowed_lateness=lateness)
                        .aggregate({"v": ["sum", "count"]}, id="win"))
        windowed.sink(CollectSink(), id="out")
        windowed.late_records(id="late").sink(CollectSink(), id="late-out")
        coord = InMemoryCoordinator()
        run = ThreadedRun(p, coord.reporter, coord.events, SMALL)
        results = run.start().join(60)
        window = run.subtask("win", 0).chain.operators[0]
        assert not any(window.state.groups.values()), "a session's state outlived its allowed lateness"
        counted[records] = window.late_records
        if records:
            emitted[records] = list(collected(results))
            late_rows[records] = sorted(r["v"] for r in collected(results, "late-out"))
        else:
            emitted[records] = [(r.pop("k"), r.pop("window_start"), r.pop("window_end"), r)
                                for b in collected(results) for r in b.to_pylist()]
            late_rows[records] = sorted(r["v"] for b in collected(results, "late-out") for r in b.to_pylist())
    assert counted == {False: len(late), True: len(late)}
    assert late_rows == {False: [r["v"] for r in late], True: [r["v"] for r in late]}
    assert last_sessions(emitted[False]) == want
    assert last_sessions(emitted[True]) == want
    # rows within the allowed lateness of a fired session fire it again (merged, or with the row), at once
    assert (len(emitted[False]) > len(want)) == (lateness > 0)


def test_batch_session_windows_refuse_a_source_without_watermarks_and_bad_arguments_before_running(tmp_path):
    p = Pipeline("bad", parallelism=1)
    plain = p.source(ParquetSource(str(tmp_path), batches=True), id="plain").key_by("k")
    with pytest.raises(PipelineError, match="no watermarks"):
        plain.window(EventTimeSessionWindows.with_gap(100))
    timed = p.source(ParquetSource(str(tmp_path), batches=True), id="timed",
                     watermarks=WatermarkStrategy.for_bounded_out_of_orderness(10, timestamp="ts")).key_by("k")
    with pytest.raises(PipelineError, match="allowed_lateness"):
        timed.window(EventTimeSessionWindows.with_gap(100), allowed_lateness=-1)
    with pytest.raises(PipelineError, match="choose from sum, count, min, max, mean"):
        timed.window(EventTimeSessionWindows.with_gap(100)).aggregate({"v": "median"})
    with pytest.raises(PipelineError, match="at least one column"):
        timed.window(EventTimeSessionWindows.with_gap(100)).aggregate({})
    with pytest.raises(ValueError, match="gap 0 ms must be positive"):
        EventTimeSessionWindows.with_gap(0)
    sessions = timed.window(EventTimeSessionWindows.with_gap(100)).aggregate({"v": "sum"}, id="sessions")
    assert isinstance(sessions.node.op, KeyedBatchSessionAggregate)
    assert sessions.late_records(id="late").node.op.side == late_tag("sessions")


# ====================================================================================== restore and rescale


@pytest.mark.parametrize("windows_after", [2, 3])
def test_a_restore_of_an_unaligned_checkpoint_of_batch_sessions_fires_every_session_once_with_all_its_rows(
        tmp_path, windows_after):
    """Stopped after an unaligned checkpoint taken under backpressure (sub-batches in flight in it), restored at
    the same parallelism or with the sessions rescaled 2 -> 3: the results kept in the sink's state plus those of
    the restored run are every session once, with every row."""
    gap = 50
    rows = write_sessions(tmp_path / "in", 1500, gap)
    coord = InMemoryCoordinator()
    first = ThreadedRun(session_pipeline(tmp_path / "in", gap, slow_down=True), coord.reporter, coord.events,
                        SMALL).start()
    wait_for(lambda: first.subtask("win", 0).records_in > 20, "sub-batches to flow")
    coord.trigger(1, "unaligned")
    wait_for(lambda: len(coord.acks.get(1, {})) == 4, "checkpoint 1")
    coord.publish(JobStatusChanged(status="CANCELLED"))
    first.join(60)
    acks = coord.acks[1]
    old = plan_from_acks(acks)
    assert any(p["input_channel_state"] for k, p in old.items() if k[0] == "win"), (
        "no sub-batch in flight in the checkpoint: not an unaligned restore under backpressure"
    )
    assert any(p["operator_state"] for k, p in old.items() if k[0] == "win")
    plan = old if windows_after == 2 else rescale_plan(acks, "win", windows_after)

    def fetch(blob_id, start, end):
        data = coord.blobs[blob_id]
        return data if start is None else data[start : end + 1]

    second_coord = InMemoryCoordinator()
    second = ThreadedRun(session_pipeline(tmp_path / "in", gap, windows=windows_after, slow_down=True),
                         second_coord.reporter, second_coord.events, SMALL, restore=plan, fetch=fetch,
                         restore_checkpoint=1)
    results = second.start().join(120)
    assert [v.parallelism for v in second.plan.vertices] == [2, windows_after]
    assert fired(collected(results)) == expected_sessions(rows, gap)


# ====================================================================================== the operator directly


class Sessions:
    """A batch session operator of one subtask (of ``parallelism``), its result rows and late rows; ``feed`` sends
    one batch, then advances the watermark and fires what is due."""

    def __init__(self, gap: int, lateness: int = 0, subtask: int = 0, parallelism: int = 1,
                 aggs: list[str] | None = None) -> None:
        self.op = KeyedBatchSessionAggregate("s", "k", EventTimeSessionWindows.with_gap(gap), "ts",
                                             {"v": aggs or ["sum", "count", "min", "max"]}, lateness)
        self.op.open(subtask, parallelism, 128)
        self.out: list = []
        self.late: list = []
        self.op.bind_side_outputs({late_tag("s"): self.late.append})
        self.process = self.op.bind(self.out.append)
        self.timers_fired = 0
        self.schema = pa.schema([("k", pa.string()), ("ts", pa.int64()), ("v", pa.float64())])

    def feed(self, rows: list[tuple], watermark: int | None = None) -> None:
        if rows:
            self.process(SubtaskBatch(rows[0][0], "k", pa.RecordBatch.from_pylist(
                [{"k": k, "ts": ts, "v": v} for k, ts, v in rows], schema=self.schema)))
        if watermark is not None:
            self.advance(watermark)

    def advance(self, watermark: int) -> None:
        self.op.advance_watermark(watermark)
        while (timer := self.op.timers.pop_due(0)) is not None:
            self.op.on_timer(*timer)
            self.timers_fired += 1
        self.op.timers_fired()

    def rows(self) -> list[tuple]:
        return [(r["k"], r["window_start"], r["window_end"], r["v_sum"], r["v_count"])
                for b in self.out for r in b.to_pylist()]

    def late_rows(self) -> list[tuple]:
        return [(r["k"], r["ts"]) for b in self.late for r in b.to_pylist()]


def test_a_batch_that_bridges_two_sessions_merges_the_three_and_the_merged_sessions_timers_fire_nothing():
    h = Sessions(gap=10)
    h.feed([("a", 0, 1), ("a", 30, 2), ("b", 5, 7)], watermark=-1)
    assert h.op.state.groups[key_group("a", 128)]["a"] == {(0, 10): [1, 1, 1, 1], (30, 40): [2, 1, 2, 2]}
    h.feed([("a", 10, 3), ("a", 20, 4)])  # 10 touches [0, 10), 20 touches [30, 40), and they touch each other
    assert h.op.state.groups[key_group("a", 128)]["a"] == {(0, 40): [10, 4, 1, 4]}
    assert sorted((ts, ns) for t in h.op.timers.event.groups.values() for ts, _, ns in t) == [
        (14, ("b", 5, 15)), (39, ("a", 0, 40))]
    h.advance(100)
    assert h.rows() == [("b", 5, 15, 7, 1), ("a", 0, 40, 10, 4)]
    assert h.timers_fired == 2, "a timer of a merged session fired"
    assert h.op.state.groups == {}


def test_a_stale_timer_of_a_session_that_grew_does_not_fire_it_early():
    """The session's timers name its bounds: one left at the end a session had before it grew (here put back by
    hand, as a timer a merge failed to delete would be) finds no such session and fires nothing."""
    h = Sessions(gap=10)
    h.feed([("a", 0, 1)], watermark=-1)
    h.feed([("a", 8, 2)])  # [0, 18)
    kg = key_group("a", 128)
    h.op.timers.register_event_time(kg, 9, ("a", 0, 10), kg)
    h.advance(12)
    assert h.rows() == [] and h.timers_fired == 1
    h.advance(17)
    assert h.rows() == [("a", 0, 18, 3, 2)]


def test_a_late_row_that_would_join_a_session_still_open_is_not_late_over_batches():
    """As the record path's test of the same name, a batch per record."""
    h = Sessions(gap=10)
    h.feed([("a", 20, 1)], watermark=15)
    h.feed([("a", 12, 1)])  # alone its session [12, 22) ended at 21 > 15: on time, merges into [12, 30)
    assert h.late_rows() == []
    h.advance(29)
    assert h.rows() == [("a", 12, 30, 2, 2)]
    h.feed([("a", 1, 1)])
    assert h.late_rows() == [("a", 1)] and h.op.late_records == 1


def test_whether_a_row_of_a_batch_is_late_depends_on_the_rows_before_it_as_for_records():
    """Watermark 100, gap 10: a row at 88 alone would end at 97, gone; after a row at 95 of its key it joins that
    row's session [95, 105) and is not late. Rows of the batch go in its order, as records would."""
    first = Sessions(gap=10)
    first.advance(100)
    first.feed([("a", 88, 1), ("a", 95, 2), ("b", 50, 3)], watermark=200)
    assert first.late_rows() == [("a", 88), ("b", 50)]
    assert first.rows() == [("a", 95, 105, 2, 1)]
    then = Sessions(gap=10)
    then.advance(100)
    then.feed([("a", 95, 2), ("a", 88, 1), ("b", 50, 3)], watermark=200)
    assert then.late_rows() == [("b", 50)]
    assert then.rows() == [("a", 88, 105, 3, 2)]


def test_a_row_within_the_lateness_of_a_fired_session_merges_into_it_and_fires_it_again_at_once():
    h = Sessions(gap=10, lateness=20)
    h.feed([("a", 0, 1), ("a", 5, 2)], watermark=14)
    assert h.rows() == [("a", 0, 15, 3, 2)]
    h.feed([("a", 12, 4)])  # joins the fired session: [0, 22), which ends after the watermark: a timer
    assert h.rows() == [("a", 0, 15, 3, 2)]
    h.advance(25)
    assert h.rows()[-1] == ("a", 0, 22, 7, 3)
    h.feed([("a", 13, 8)])  # [0, 23) ended at 22 <= 25, within its lateness: fired again at once
    assert h.rows()[-1] == ("a", 0, 23, 15, 4) and len(h.rows()) == 3
    h.advance(41)  # the lateness of [0, 22) is over, not that of [0, 23)
    assert h.op.state.groups != {}
    h.advance(42)
    assert h.op.state.groups == {} and len(h.rows()) == 3
    h.feed([("a", 3, 16)])
    assert h.late_rows() == [("a", 3)] and len(h.rows()) == 3


@pytest.mark.parametrize("lateness", [0, 7, 30])
def test_batch_sessions_hold_the_record_paths_sessions_timers_and_late_rows_after_every_batch(lateness):
    """Random rows, out of order and late, in random batches, with the watermark advanced between them: after
    every batch and round of timers, the batch operator holds the same sessions (bounds and partials), the same
    pending timers and has sent the same late rows as the record path's session window fed the same rows as
    records; its last firing of each session is the record path's."""
    rng = random.Random(lateness)
    batches = Sessions(gap=10, lateness=lateness)
    records = WindowOperator("w", lambda r: r["k"], EventTimeSessionWindows.with_gap(10),
                             AggregateFunction(lambda: [None, 0, None, None], add, merge), lambda r: r["ts"],
                             lateness)
    records.open(0, 1, 128)
    record_out: list = []
    record_late: list = []
    records.bind_side_outputs({late_tag("w"): record_late.append})
    process = records.bind(record_out.append)
    watermark = 0
    for _ in range(120):
        rows = [(f"k{rng.randrange(5)}", watermark - 40 + rng.randrange(70), rng.choice([None, *range(9)]))
                for _ in range(rng.randrange(1, 12))]
        batches.feed(rows)
        for k, ts, v in rows:
            process({"k": k, "ts": ts, "v": v})
        watermark += rng.randrange(0, 15)
        batches.advance(watermark)
        records.advance_watermark(watermark)
        while (timer := records.timers.pop_due(0)) is not None:
            records.on_timer(*timer)
        held = {(g, k, w): acc for g, keys in batches.op.state.groups.items() for k, ws in keys.items()
                for w, acc in ws.items()}
        assert held == {(g, k, tuple(w)): acc for g, keys in records.state.groups.items() for k, ws in keys.items()
                        for w, acc in ws.items()}
        assert {(ts, ns) for t in batches.op.timers.event.groups.values() for ts, _, ns in t} == {
            (ts, (k, *w)) for t in records.timers.event.groups.values() for ts, k, w in t}
        assert batches.late_rows() == [(r["k"], r["ts"]) for r in record_late]
    assert batches.op.late_records == records.late_records > 0
    got = last_sessions([(k, s, e, (total, n)) for k, s, e, total, n in batches.rows()])
    assert got == last_sessions([(k, s, e, (acc[0], acc[1])) for k, s, e, acc in record_out])
    assert len(got) > 20


def test_batch_session_windows_refuse_rows_without_an_event_time():
    h = Sessions(gap=10)
    with pytest.raises(ValueError, match="session aggregate 's': 1 rows of a batch have no event time"):
        h.feed([("a", 1, 1), ("a", None, 2)])


def _view(op: KeyedBatchSessionAggregate) -> tuple:
    """What a batch session operator holds: its sessions' partials and its pending timers, by key group."""
    sessions = {(g, k, w): tuple(acc) for g, keys in op.state.groups.items() for k, ws in keys.items()
                for w, acc in ws.items()}
    return sessions, {g: sorted(t) for g, t in op.timers.event.groups.items()}


def test_a_snapshot_of_batch_sessions_restores_them_and_their_timers_in_any_key_group_range():
    h = Sessions(gap=10, lateness=5, aggs=["sum", "count", "mean"])
    keys = [f"k{n % 13}" for n in range(400)]
    h.feed([(k, n // 4 + 30 * (n % 3), float(n) if n % 7 else None) for n, k in enumerate(keys)], watermark=60)
    held = _view(h.op)
    assert held[0] and len({g for g, _, _ in held[0]}) > 2
    assert any(ts == e - 1 + 5 for t in held[1].values() for ts, _, (_, _, e) in t), "a fired session is kept"
    blob = pickle.dumps(h.op.snapshot(1), protocol=5)  # as the chain stores it
    before = len(h.rows())
    h.advance(1_000)
    then = sorted(h.rows()[before:])
    assert len(then) == sum(1 for t in held[1].values() for ts, _, (_, _, e) in t if ts == e - 1)
    for parallelism in (1, 2, 3):
        parts = []
        for i in range(parallelism):
            part = Sessions(gap=10, lateness=5, subtask=i, parallelism=parallelism, aggs=["sum", "count", "mean"])
            part.op.restore(pickle.loads(blob))
            lo, hi = part.op.state.key_group_range
            assert _view(part.op) == ({w: v for w, v in held[0].items() if lo <= w[0] <= hi},
                                      {g: t for g, t in held[1].items() if lo <= g <= hi})
            part.op.timers.restored(60)
            part.advance(1_000)
            parts.append(part)
        # each fires what it holds, once, as the operator it came from did
        assert sorted(r for part in parts for r in part.rows()) == then
        assert all(part.op.state.groups == {} for part in parts)
