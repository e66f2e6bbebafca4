"""The PostgreSQL sink in upsert mode (``key=[...]``): a checkpoint's rows go in with ``INSERT ... ON CONFLICT (key)
DO UPDATE`` when it completes, the last one written winning per key, under the same commit marker as inserts; so a
keyed running aggregate leaves one row per key holding its final value, across restores. A rewind takes back the
later checkpoints' markers and no row."""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from itertools import pairwise

import pandas as pd
import psycopg
import pyarrow as pa
import pytest

from contract.events import JobStatusChanged
from spark_plugin import ParquetSource, Pipeline
from spark_plugin.connectors import SequenceSource
from spark_plugin.connectors.postgres import MARKERS, PostgresSink
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.fakes import InMemoryCoordinator, sample_until
from tests.spark_plugin.test_postgres_batches_threads import FILES, open_sink, write_input
from tests.spark_plugin.test_restore_threads import SMALL, plan_from_acks
from tests.spark_plugin.test_subtask_threads import wait_for

pytestmark = pytest.mark.postgres

KEYS = 9


@pytest.fixture
def dsn(pg_url):
    dsn = pg_url.replace("postgresql+asyncpg://", "postgresql://", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE counts (k int PRIMARY KEY, n bigint NOT NULL)")
        conn.execute("CREATE TABLE spend (k text PRIMARY KEY, amount_sum bigint, amount_count bigint)")
        conn.execute("CREATE TABLE latest (k text PRIMARY KEY, seq int, note text)")
        conn.execute("CREATE TABLE tags (k text, tag text, PRIMARY KEY (k, tag))")
        conn.execute("CREATE TABLE readings (k text, seq int, note text, UNIQUE (k, seq))")
        conn.execute("CREATE UNIQUE INDEX ON readings (note) WHERE note IS NOT NULL")  # partial: no arbiter
    return dsn


def query(dsn: str, statement: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(statement, params).fetchall()


def execute(dsn: str, statement: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement)


def markers(dsn: str) -> list[tuple]:
    """``(checkpoint, subtask, xact)`` of every commit marker, ordered."""
    return query(dsn, f"SELECT checkpoint_id, subtask, xact::text FROM {MARKERS} ORDER BY 1, 2")


def latest_sink(dsn: str) -> PostgresSink:
    return PostgresSink(dsn, "latest", ["k", "seq", "note"], key=["k"])


# ---------------------------------------------------------------- keyed running counts through pipelines


def reference_counts(count: int) -> dict[int, int]:
    """Per key, the records of ``SequenceSource(count, keys=KEYS)``: the final running count, in plain Python."""
    source = SequenceSource(count=count, keys=KEYS)
    source.open(0, 1)
    return dict(Counter(source.key_of(seq) for seq in range(count)))


def slow_count(n: int, record) -> int:
    time.sleep(0.0005)  # per record: the run is still going when the test's checkpoints complete
    return n + 1


def counting(dsn: str, count: int, add=lambda n, r: n + 1) -> Pipeline:
    p = Pipeline("pg-upsert", parallelism=2)
    (
        p.source(SequenceSource(count=count, keys=KEYS), id="src")
        .key_by(lambda r: r[0])
        .aggregate(lambda: 0, add, id="count")  # (key, running count) after each record
        .sink(PostgresSink(dsn, "counts", ["k", "n"], key=["k"]), id="out")
    )
    return p


def run_to_end(pipeline: Pipeline, **restore) -> list:
    coord = InMemoryCoordinator()
    run = ThreadedRun(pipeline, coord.reporter, coord.events, SMALL, **restore)
    coord.expected_subtasks = len(run.subtasks)  # the sources' final checkpoint completes and commits the rest
    return run.start().join(120)


def sinks(run: ThreadedRun, vertex: str) -> list[PostgresSink]:
    return [st.chain.operators[-1].sink for st in run.subtasks if st.spec.vertex == vertex]


def counts(dsn: str) -> dict[int, int]:
    rows = query(dsn, "SELECT k, n FROM counts")
    assert len(rows) == len({k for k, _ in rows})
    return dict(rows)


def test_a_keyed_running_count_of_records_leaves_one_row_per_key_with_its_final_count(dsn):
    results = run_to_end(counting(dsn, 3000))
    assert counts(dsn) == reference_counts(3000)
    outs = [r.outputs["out"] for r in results if "out" in r.outputs]
    assert sum(o["committed_rows"] for o in outs) == 3000, "every running count was committed"
    assert KEYS <= sum(o["upserted_rows"] for o in outs) < 3000, "a commit's counts of one key were not reduced"


def test_a_keyed_running_aggregate_of_batches_leaves_one_row_per_key_with_its_final_value(tmp_path, dsn):
    rows = write_input(tmp_path / "in", 600)
    assert rows == FILES * 600
    p = Pipeline("pg-upsert-batches", parallelism=2)
    (
        p.source(ParquetSource(str(tmp_path / "in"), batch_rows=40, batches=True), id="src")
        .key_by("k")
        .aggregate({"amount": ["sum", "count"]}, id="agg")  # a batch of (k, amount_sum, amount_count) per sub-batch
        .sink(PostgresSink(dsn, "spend", ["k", "amount_sum", "amount_count"], key=["k"]), id="out")
    )
    results = run_to_end(p)
    expected: dict[str, list[int]] = {}
    for n in range(rows):
        e = expected.setdefault(f"user-{n % 7}", [0, 0])
        e[0] += n % 13
        e[1] += 1
    table = query(dsn, "SELECT * FROM spend")
    assert len(table) == 7 and {k: [s, c] for k, s, c in table} == expected
    outs = [r.outputs["out"] for r in results if "out" in r.outputs]
    assert all(o["copied_rows"] == o["committed_rows"] for o in outs), "the aggregates came as batches"
    assert sum(o["committed_rows"] for o in outs) > 7 and sum(o["upserted_rows"] for o in outs) >= 7


# ---------------------------------------------------------------- exactly once across restores


def first_run(dsn: str, count: int, checkpoints: int) -> tuple[InMemoryCoordinator, list[dict]]:
    """Run the counting pipeline from nothing committed, complete and commit ``checkpoints`` unaligned checkpoints
    while records flow, and cancel it; returns its coordinator and the table after each checkpoint's commit."""
    execute(dsn, "TRUNCATE counts")
    coord = InMemoryCoordinator(expected_subtasks=4)
    run = ThreadedRun(counting(dsn, count, slow_count), coord.reporter, coord.events, SMALL).start()
    wait_for(lambda: run.subtask("count", 0).records_in > 300, "records to flow")
    tables = []
    for cid in range(1, checkpoints + 1):
        coord.trigger(cid, "unaligned")
        wait_for(lambda cid=cid: cid in coord.completed, f"checkpoint {cid}")
        wait_for(lambda cid=cid: not any(c <= cid for s in sinks(run, "count") for c, _ in list(s.pending)),
                 f"the sinks to commit checkpoint {cid}")
        tables.append(counts(dsn))
    coord.publish(JobStatusChanged(status="CANCELLED"))
    run.join(60)
    return coord, tables


def restored(dsn: str, coord: InMemoryCoordinator, count: int, checkpoint: int) -> ThreadedRun:
    """The second attempt, restored from ``checkpoint`` of ``coord``'s run: built (so its sinks have rewound and
    restored), not started."""

    def fetch(blob_id, start, end):
        data = coord.blobs[blob_id]
        return data if start is None else data[start : end + 1]

    second = InMemoryCoordinator(expected_subtasks=4)
    second.next_id = max(coord.completed) + 1
    return ThreadedRun(counting(dsn, count), second.reporter, second.events, SMALL,
                       restore=plan_from_acks(coord.acks[checkpoint]), fetch=fetch, restore_checkpoint=checkpoint)


def mid_stream(count: int):
    def why_not(sample):
        _, tables = sample
        totals = [sum(t.values()) for t in tables]
        ok = 0 < totals[0] and all(a < b for a, b in pairwise(totals)) and totals[-1] < count
        return None if ok else {"records counted at each commit": totals}

    return why_not


def test_a_restore_of_a_committed_checkpoint_finds_its_marker_and_changes_nothing(dsn):
    count = 4000
    coord, tables = sample_until(lambda: first_run(dsn, count, 1), mid_stream(count), "checkpoint mid-stream")
    before = query(dsn, "SELECT k, n, xmin::text FROM counts ORDER BY k")
    committed = markers(dsn)
    second = restored(dsn, coord, count, 1)  # its sinks commit checkpoint 1's pending counts again: markers found
    assert query(dsn, "SELECT k, n, xmin::text FROM counts ORDER BY k") == before, "a repeated commit changed rows"
    assert markers(dsn) == committed
    second.start().join(120)
    assert counts(dsn) == reference_counts(count)
    assert [m for m in markers(dsn) if m[0] == 1] == committed, "checkpoint 1 was committed a second time"


def test_a_restore_from_before_a_committed_checkpoint_keeps_its_rows_deletes_its_markers_and_replays_over_them(
    dsn, caplog
):
    count = 4000
    coord, tables = sample_until(lambda: first_run(dsn, count, 2), mid_stream(count), "checkpoints mid-stream")
    assert tables[1] != tables[0]
    with caplog.at_level(logging.WARNING, logger="spark_plugin.connectors.postgres"):
        second = restored(dsn, coord, count, 1)
    assert counts(dsn) == tables[1], "rows upserted by checkpoint 2 must stay (their old values are gone)"
    assert {m[0] for m in markers(dsn)} == {1}, "checkpoint 2's markers must be deleted"
    assert "checkpoints [2] were committed as upserts into counts" in caplog.text
    results = second.start().join(120)
    assert counts(dsn) == reference_counts(count)
    outs = [r.outputs["out"] for r in results if "out" in r.outputs]
    assert all(o["withdrawn_rows"] == 0 for o in outs), outs
    assert [c for o in outs for c in o["withdrawn_checkpoints"]] == [2], "one subtask took back the markers"


def test_a_commit_repeated_after_a_restore_changes_no_row(dsn):
    sink = open_sink(latest_sink(dsn))
    sink.write(("a", 1, "first"))
    sink.write(("b", 2, "first"))
    state = sink.snapshot(1)
    sink.notify_checkpoint_complete(1)
    sink.close()
    before = query(dsn, "SELECT k, seq, note, xmin::text FROM latest ORDER BY k")
    again = latest_sink(dsn)
    again.open(0, 1)
    again.rewind(1, 1)
    again.restore(state)  # checkpoint 1's pending rows, committed before the first attempt ended
    out = again.close()
    assert query(dsn, "SELECT k, seq, note, xmin::text FROM latest ORDER BY k") == before
    assert out["upserted_rows"] == 0 and out["committed_rows"] == 0


def test_a_rewind_deletes_the_later_markers_and_no_row_and_the_replay_overwrites_what_it_writes(dsn, caplog):
    sink = open_sink(latest_sink(dsn))
    for cid, rows in [(1, [("a", 1, "c1"), ("b", 1, "c1")]), (2, [("a", 2, "c2"), ("c", 2, "c2")]), (3, [("a", 3, "c3")])]:
        for r in rows:
            sink.write(r)
        sink.snapshot(cid)
        sink.notify_checkpoint_complete(cid)
    sink.close()
    again = latest_sink(dsn)
    again.open(0, 1)
    with caplog.at_level(logging.WARNING, logger="spark_plugin.connectors.postgres"):
        again.rewind(1, 1)
    assert query(dsn, "SELECT * FROM latest ORDER BY k") == [("a", 3, "c3"), ("b", 1, "c1"), ("c", 2, "c2")]
    assert [m[0] for m in markers(dsn)] == [1]
    assert ("restarts from checkpoint 1: checkpoints [2, 3] were committed as upserts into latest, which cannot be "
            "withdrawn; deleted their commit markers and no row") in caplog.text
    again.write(("a", 2, "replay"))  # checkpoint 2 again, its marker gone: committed, not skipped
    again.write(("c", 5, "replay"))
    again.snapshot(2)
    again.notify_checkpoint_complete(2)
    out = again.close()
    assert query(dsn, "SELECT * FROM latest ORDER BY k") == [("a", 2, "replay"), ("b", 1, "c1"), ("c", 5, "replay")]
    assert out["upserted_rows"] == 2 and out["withdrawn_checkpoints"] == [2, 3] and out["withdrawn_rows"] == 0


# ---------------------------------------------------------------- the last one written wins within a commit


def test_rows_of_one_key_in_one_commit_leave_the_last_one_written(dsn):
    execute(dsn, "INSERT INTO latest VALUES ('a', 0, 'before'), ('z', 0, 'untouched')")
    sink = open_sink(latest_sink(dsn))
    for r in [("a", 1, "x"), ("b", 2, "x"), ("a", 3, "x"), ("a", 4, "last")]:
        sink.write(r)
    sink.snapshot(1)
    assert query(dsn, "SELECT seq FROM latest WHERE k = 'a'") == [(0,)], "written before its checkpoint completed"
    sink.notify_checkpoint_complete(1)
    sink.write(("b", 5, "later"))
    sink.snapshot(2)
    sink.notify_checkpoint_complete(2)
    out = sink.close()
    assert query(dsn, "SELECT * FROM latest ORDER BY k") == [("a", 4, "last"), ("b", 5, "later"), ("z", 0, "untouched")]
    assert out["committed_rows"] == 5 and out["upserted_rows"] == 3, out


def test_batches_of_one_key_in_one_commit_leave_the_last_row_written(dsn):
    execute(dsn, "INSERT INTO latest VALUES ('a', 0, 'before')")
    sink = open_sink(latest_sink(dsn))
    sink.write(pa.RecordBatch.from_pydict({"note": ["x", "x", "x"], "k": ["a", "b", "a"], "seq": [1, 2, 3]}))
    sink.write(pd.DataFrame({"k": ["b", "c", "b"], "seq": [4, 5, 6], "note": ["y", "y", "last"]}))
    sink.snapshot(1)
    sink.notify_checkpoint_complete(1)
    out = sink.close()
    assert query(dsn, "SELECT * FROM latest ORDER BY k") == [("a", 3, "x"), ("b", 6, "last"), ("c", 5, "y")]
    assert out["copied_rows"] == 6 and out["upserted_rows"] == 3, out


def test_rows_and_batches_of_one_commit_keep_their_write_order_for_a_key(dsn):
    sink = open_sink(latest_sink(dsn))
    sink.write(pa.RecordBatch.from_pydict({"k": ["a", "b"], "seq": [1, 1], "note": ["batch", "batch"]}))
    sink.write(("a", 2, "row after the batch"))
    sink.write(("b", 2, "row before the batch"))
    sink.write(pa.RecordBatch.from_pydict({"k": ["b", "c"], "seq": [3, 3], "note": ["batch after the row", "batch"]}))
    sink.write(("c", 4, "row after the batch"))
    sink.snapshot(1)
    sink.notify_checkpoint_complete(1)
    sink.close()
    assert query(dsn, "SELECT * FROM latest ORDER BY k") == [
        ("a", 2, "row after the batch"), ("b", 3, "batch after the row"), ("c", 4, "row after the batch"),
    ]


def test_a_key_of_every_column_keeps_the_rows_there_and_adds_the_new_ones(dsn):
    execute(dsn, "INSERT INTO tags VALUES ('a', 'x')")
    sink = open_sink(PostgresSink(dsn, "tags", ["k", "tag"], key=["tag", "k"]))  # the primary key, in any order
    for r in [("a", "x"), ("a", "y"), ("a", "y")]:
        sink.write(r)
    sink.write(pa.RecordBatch.from_pydict({"k": ["a", "b"], "tag": ["x", "x"]}))
    sink.snapshot(1)
    sink.notify_checkpoint_complete(1)
    out = sink.close()
    assert query(dsn, "SELECT * FROM tags ORDER BY k, tag") == [("a", "x"), ("a", "y"), ("b", "x")]
    assert out["upserted_rows"] == 2, out


# ---------------------------------------------------------------- refused before anything is written


@pytest.mark.parametrize("key", [
    ["k"],  # a part of a unique key
    ["note"],  # only a partial unique index: ON CONFLICT (note) cannot take it
    ["k", "seq", "note"],  # more than a unique key
], ids=["part-of-a-key", "partial-index", "more-than-a-key"])
def test_open_refuses_a_key_that_is_not_exactly_a_unique_index_and_writes_nothing(dsn, key):
    execute(dsn, "INSERT INTO readings VALUES ('a', 1, 'kept')")
    sink = PostgresSink(dsn, "readings", ["k", "seq", "note"], key=key)
    message = f"key {key!r} is not the primary key or a unique index of table readings (its unique keys: (k, seq))"
    with pytest.raises(ValueError, match=re.escape(message)):
        sink.open(0, 1)
    assert query(dsn, "SELECT * FROM readings") == [("a", 1, "kept")]
    assert query(dsn, "SELECT to_regclass(%s)::text", (MARKERS,)) == [(None,)], "went on opening after the refusal"


def test_open_refuses_a_table_without_a_unique_index_naming_it(dsn):
    execute(dsn, "CREATE TABLE plain (k text, n int)")
    with pytest.raises(ValueError, match=r"table plain \(its unique keys: none\).*ADD PRIMARY KEY \(k\)"):
        PostgresSink(dsn, "plain", ["k", "n"], key=["k"]).open(0, 1)
    assert query(dsn, "SELECT * FROM plain") == []


@pytest.mark.parametrize("key, error, message", [
    (["id"], ValueError, r"key \['id'\] is not among the columns it writes to latest, \['k', 'seq', 'note'\]"),
    ([], ValueError, r"key=\[\] names no column"),
    ("k", TypeError, r"not a string: key=\['k'\]"),
], ids=["not-a-column", "empty", "a-string"])
def test_a_key_that_cannot_be_upserted_on_is_refused_when_the_sink_is_made(dsn, key, error, message):
    execute(dsn, "INSERT INTO latest VALUES ('a', 1, 'kept')")
    with pytest.raises(error, match=message):
        PostgresSink(dsn, "latest", ["k", "seq", "note"], key=key)
    assert query(dsn, "SELECT * FROM latest") == [("a", 1, "kept")]


def test_a_batch_without_a_key_column_fails_naming_it(dsn):
    sink = open_sink(PostgresSink(dsn, "latest", key=["k"]))  # no columns: every column of each batch
    try:
        with pytest.raises(KeyError, match=r"on key \['k'\]; the batch has no 'k'"):
            sink.write(pa.RecordBatch.from_pydict({"seq": [1], "note": ["x"]}))
    finally:
        sink.close()
