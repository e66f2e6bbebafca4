"""The PostgreSQL sink taking record batches: each batch goes in with COPY, inside the checkpoint's commit
transaction and under its marker, so a batch pipeline restored from an unaligned checkpoint writes every row once;
its columns are taken by name."""

from __future__ import annotations

import time

import pandas as pd
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contract.events import JobStatusChanged
from spark_plugin import ParquetSource, Pipeline
from spark_plugin.connectors.postgres import MARKERS, PostgresSink
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.fakes import InMemoryCoordinator, sample_until
from tests.spark_plugin.test_restore_threads import SMALL, plan_from_acks
from tests.spark_plugin.test_subtask_threads import wait_for

pytestmark = pytest.mark.postgres

FILES = 4


@pytest.fixture
def dsn(pg_url):
    dsn = pg_url.replace("postgresql+asyncpg://", "postgresql://", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE results (k text, seq int, cents bigint)")
    return dsn


@pytest.fixture
def copies(monkeypatch):
    """The statements of every COPY any connection of this process runs (the sink's subtasks are threads)."""
    seen: list[str] = []
    original = psycopg.Cursor.copy

    def spy(self, statement, *a, **kw):
        seen.append(statement if isinstance(statement, str) else statement.as_string(self))
        return original(self, statement, *a, **kw)

    monkeypatch.setattr(psycopg.Cursor, "copy", spy)
    return seen


def table(dsn: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT k, seq, cents FROM results ORDER BY seq").fetchall()


def write_input(directory, rows_per_file: int) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(FILES):
        seqs = range(f * rows_per_file, (f + 1) * rows_per_file)
        part = [{"seq": n, "k": f"user-{n % 7}", "amount": n % 13} for n in seqs]
        pq.write_table(pa.Table.from_pylist(part), directory / f"part-{f}.parquet", row_group_size=100)
    return FILES * rows_per_file


def slow(batch):
    time.sleep(0.01)  # per batch: backpressure on the edge into the sink, so the checkpoint holds batches in flight
    return batch


def batch_to_postgres(directory, dsn: str) -> Pipeline:
    p = Pipeline("pg-batches", parallelism=2)
    (
        p.source(ParquetSource(str(directory), batch_rows=40, batches=True), id="src")
        .map_batches(lambda df: df.assign(cents=df.amount * 100), format="pandas", id="cents")
        .rebalance()
        .map_batches(slow, id="slow")
        .sink(PostgresSink(dsn, "results", ["k", "seq", "cents"]), id="out")  # the batch has amount too, first
    )
    return p


def test_a_batch_pipeline_restored_from_an_unaligned_checkpoint_copies_every_row_once(tmp_path, dsn, copies):
    count = write_input(tmp_path / "in", 2500)

    def take():
        with psycopg.connect(dsn, autocommit=True) as conn:  # a retake starts from nothing committed, as the first did
            conn.execute("TRUNCATE results")
            if conn.execute("SELECT to_regclass(%s)", (MARKERS,)).fetchone()[0] is not None:
                conn.execute(f"DELETE FROM {MARKERS} WHERE sink = 'results'")
        coord = InMemoryCoordinator(expected_subtasks=4)
        first = ThreadedRun(batch_to_postgres(tmp_path / "in", dsn), coord.reporter, coord.events, SMALL).start()
        wait_for(lambda: first.subtask("slow", 0).records_in > 20, "batches to flow")
        coord.trigger(1, "unaligned")
        wait_for(lambda: 1 in coord.completed, "checkpoint 1")
        sinks = [st.chain.operators[-1].sink for st in first.subtasks if st.spec.vertex == "slow"]
        wait_for(lambda: not any(c <= 1 for s in sinks for c, _ in list(s.pending)), "the sinks to commit checkpoint 1")
        coord.publish(JobStatusChanged(status="CANCELLED"))
        first.join(60)
        return coord, len(table(dsn))

    def why_not(sample):
        coord, committed = sample
        in_flight = sum(1 for k, p in plan_from_acks(coord.acks[1]).items()
                        if k[0] == "slow" and p["input_channel_state"])
        # checkpoint 1 committed some rows and not all (a restore to test), with batches in flight (unaligned)
        return None if 0 < committed < count and in_flight else {"committed": committed, "slow subtasks with input in flight": in_flight}

    first_coord, _ = sample_until(take, why_not, "unaligned checkpoint mid-stream with batches in flight")
    plan = plan_from_acks(first_coord.acks[1])

    def fetch(blob_id, start, end):
        data = first_coord.blobs[blob_id]
        return data if start is None else data[start : end + 1]

    second_coord = InMemoryCoordinator(expected_subtasks=4)
    second_coord.next_id = 2
    ThreadedRun(batch_to_postgres(tmp_path / "in", dsn), second_coord.reporter, second_coord.events, SMALL,
                restore=plan, fetch=fetch, restore_checkpoint=1).start().join(120)
    rows = table(dsn)
    seqs = [seq for _, seq, _ in rows]
    assert seqs == list(range(count)), f"{len(seqs) - len(set(seqs))} duplicates, {count - len(set(seqs))} missing"
    assert rows == [(f"user-{n % 7}", n, n % 13 * 100) for n in range(count)]
    assert copies and all(s.startswith('COPY "results" ("k", "seq", "cents") FROM STDIN') for s in copies)


def open_sink(sink: PostgresSink) -> PostgresSink:
    sink.open(0, 1)
    sink.rewind(1, None)
    return sink


def test_a_batch_and_a_dataframe_go_in_by_column_name_with_copy_and_records_with_insert(dsn, copies):
    sink = open_sink(PostgresSink(dsn, "results", ["seq", "k"]))
    sink.write(pa.RecordBatch.from_pydict({"k": ["a", "b"], "other": [0, 0], "seq": [1, 2]}))
    sink.write(pd.DataFrame({"seq": [3], "k": ["c"]}))
    sink.write((4, "d"))  # a record: to_row's tuple, in the order of the columns
    sink.snapshot(1)
    assert table(dsn) == [], "written before its checkpoint completed"
    sink.notify_checkpoint_complete(1)
    sink.notify_checkpoint_complete(1)  # repeated: the marker says it is in
    out = sink.close()
    assert table(dsn) == [("a", 1, None), ("b", 2, None), ("c", 3, None), ("d", 4, None)]
    assert len(copies) == 2 and out["copied_rows"] == 3 and out["committed_rows"] == 4


def test_a_sink_without_columns_copies_every_column_of_a_batch_and_refuses_records(dsn, copies):
    sink = open_sink(PostgresSink(dsn, "results"))
    sink.write(pa.RecordBatch.from_pydict({"seq": [1], "cents": [5], "k": ["x"]}))
    with pytest.raises(TypeError, match="names no columns"):
        sink.write((2, "y"))
    sink.snapshot(1)
    sink.notify_checkpoint_complete(1)
    sink.close()
    assert table(dsn) == [("x", 1, 5)]


def test_a_batch_without_one_of_the_sinks_columns_fails_naming_it(dsn):
    sink = open_sink(PostgresSink(dsn, "results", ["k", "seq"]))
    try:
        with pytest.raises(KeyError, match="no 'seq'"):
            sink.write(pa.RecordBatch.from_pydict({"k": ["a"], "n": [1]}))
    finally:
        sink.close()


def test_a_rewind_withdraws_the_rows_a_checkpoints_batches_copied_and_nothing_else(dsn, caplog):
    sink = open_sink(PostgresSink(dsn, "results", ["k", "seq"]))
    sink.write(pa.RecordBatch.from_pydict({"k": ["a", "b"], "seq": [1, 2]}))
    sink.snapshot(1)
    sink.notify_checkpoint_complete(1)
    sink.write(pa.RecordBatch.from_pydict({"k": ["c", "d", "e"], "seq": [3, 4, 5]}))
    sink.write(("f", 6))
    sink.snapshot(2)
    sink.notify_checkpoint_complete(2)
    sink.close()
    again = PostgresSink(dsn, "results", ["k", "seq"])
    again.open(0, 1)
    with caplog.at_level("WARNING"):
        again.rewind(1, 1)  # a restore from checkpoint 1: checkpoint 2's rows are written again by the new attempt
    out = again.close()
    assert [(k, seq) for k, seq, _ in table(dsn)] == [("a", 1), ("b", 2)]
    assert out["withdrawn_rows"] == 4 and "changed or deleted" not in caplog.text
