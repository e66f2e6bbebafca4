"""Committing sinks across restores that go back past committed output (fallback past a corrupt checkpoint, a
start from an older checkpoint by name): ``rewind`` withdraws exactly the output of the later checkpoints of that
job, and nothing else; driven through the Sink API as the runtime drives it, against real PostgreSQL and files."""

from __future__ import annotations

import json
import logging

import pytest

from spark_plugin.connectors.files import FileSink
from spark_plugin.connectors.postgres import PostgresSink, RewindRefused


def _dsn(pg_url: str) -> str:
    return pg_url.replace("postgresql+asyncpg://", "postgresql://", 1)


class PgTarget:
    def __init__(self, pg_url: str) -> None:
        import psycopg

        self.dsn = _dsn(pg_url)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE out (v text NOT NULL)")

    def sink(self, name: str = "out") -> PostgresSink:
        return PostgresSink(self.dsn, "out", ["v"], to_row=lambda r: (r,), name=name)

    def content(self) -> list[str]:
        import psycopg

        with psycopg.connect(self.dsn) as conn:
            return sorted(r[0] for r in conn.execute("SELECT v FROM out"))

    def sql(self, statement: str) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(statement)


class FileTarget:
    def __init__(self, tmp_path) -> None:
        self.dir = tmp_path / "out"

    def sink(self, name: str = "out") -> FileSink:
        return FileSink(str(self.dir))

    def content(self) -> list[str]:
        return sorted(json.loads(line) for f in self.dir.glob("part-*.jsonl") for line in f.read_text().splitlines())


@pytest.fixture(params=["postgres", "files"])
def target(request, tmp_path):
    if request.param == "postgres":
        pg_url = request.getfixturevalue("pg_url")
        return PgTarget(pg_url)
    return FileTarget(tmp_path)


def attempt(sink, job: int, restore_from: int | None, states: list, subtask: int = 0, parallelism: int = 1):
    """Start a sink subtask the way the runtime does: open, rewind, restore."""
    sink.open(subtask, parallelism)
    sink.rewind(job, restore_from)
    for s in states:
        sink.restore(s)
    return sink


def checkpoint(sink, cid: int, records: list[str], complete: bool = True):
    for r in records:
        sink.write(r)
    state = sink.snapshot(cid)
    if complete:
        sink.notify_checkpoint_complete(cid)
    return state


def test_a_restore_past_committed_checkpoints_withdraws_exactly_their_output(target):
    first = attempt(target.sink(), job=7, restore_from=None, states=[])
    s1 = checkpoint(first, 1, ["a", "b"])
    checkpoint(first, 2, ["c"])
    checkpoint(first, 3, ["d", "e"])
    checkpoint(first, 4, ["f"], complete=False)  # pending when the attempt dies
    first.close()
    assert target.content() == ["a", "b", "c", "d", "e"]

    # checkpoints 2 and 3 are passed over (say, a corrupt blob): the new attempt restores 1 and writes c..f again
    second = attempt(target.sink(), job=7, restore_from=1, states=[s1])
    assert target.content() == ["a", "b"], "output of checkpoints after the restored one must be withdrawn"
    checkpoint(second, 5, ["c", "d", "e", "f"])
    second.close()
    assert target.content() == ["a", "b", "c", "d", "e", "f"]

    # a later ordinary restore of the newest checkpoint withdraws nothing
    attempt(target.sink(), job=7, restore_from=5, states=[]).close()
    assert target.content() == ["a", "b", "c", "d", "e", "f"]


def test_rewinding_one_job_leaves_the_output_of_another_job_alone(target):
    one = attempt(target.sink(), job=1, restore_from=None, states=[])
    checkpoint(one, 1, ["job1-a"])
    one.close()
    two = attempt(target.sink(), job=2, restore_from=None, states=[])
    checkpoint(two, 1, ["job2-a"])  # the same checkpoint id in another job: committed, not taken as a repeat
    checkpoint(two, 2, ["job2-b"])
    two.close()
    assert target.content() == ["job1-a", "job2-a", "job2-b"]
    attempt(target.sink(), job=2, restore_from=None, states=[]).close()  # job 2 starts over from its input
    assert target.content() == ["job1-a"]


def test_every_subtask_of_a_rescaled_sink_may_rewind_and_each_row_goes_once(target):
    old = [attempt(target.sink(), job=3, restore_from=None, states=[], subtask=i, parallelism=3) for i in range(3)]
    states = [checkpoint(s, 1, [f"{i}-a"]) for i, s in enumerate(old)]
    for i, s in enumerate(old):
        checkpoint(s, 2, [f"{i}-b"])
        s.close()
    # parallelism 3 -> 2, restored from checkpoint 1: both new subtasks rewind; subtask 0 gets old 0 and 2
    new = [
        attempt(target.sink(), job=3, restore_from=1, states=[states[0], states[2]], subtask=0, parallelism=2),
        attempt(target.sink(), job=3, restore_from=1, states=[states[1]], subtask=1, parallelism=2),
    ]
    assert target.content() == ["0-a", "1-a", "2-a"]
    for s in new:
        s.close()


def test_postgres_refuses_to_withdraw_rows_it_did_not_write_and_deletes_nothing(pg_url):
    target = PgTarget(pg_url)
    sink = attempt(target.sink(), job=9, restore_from=None, states=[])
    checkpoint(sink, 1, ["a"])
    checkpoint(sink, 2, ["b", "c"])
    sink.close()
    target.sql("UPDATE overtake_sink_commits SET row_count = 1 WHERE job_id = 9 AND checkpoint_id = 2")
    with pytest.raises(RewindRefused, match=r"checkpoints \[2\] would delete 1 more rows of out"):
        attempt(target.sink(), job=9, restore_from=1, states=[])
    assert target.content() == ["a", "b", "c"]


def test_postgres_withdraws_what_is_left_of_rows_changed_since_and_says_so(pg_url, caplog):
    target = PgTarget(pg_url)
    sink = attempt(target.sink(), job=4, restore_from=None, states=[])
    checkpoint(sink, 1, ["a"])
    checkpoint(sink, 2, ["b", "c"])
    sink.close()
    target.sql("UPDATE out SET v = 'C' WHERE v = 'c'")  # someone changed a committed row
    with caplog.at_level(logging.WARNING, logger="spark_plugin.connectors.postgres"):
        again = attempt(target.sink(), job=4, restore_from=1, states=[])
    assert target.content() == ["C", "a"]
    assert again.close()["withdrawn_checkpoints"] == [2]
    assert "1 rows committed for checkpoints [2] were changed or deleted since" in caplog.text


def test_a_file_sink_rewind_deletes_the_failed_attempts_leftovers_but_not_a_live_peers_files(tmp_path):
    target = FileTarget(tmp_path)
    old = [attempt(target.sink(), job=5, restore_from=None, states=[], subtask=i, parallelism=2) for i in range(2)]
    states = [checkpoint(s, 1, [f"{i}-a"]) for i, s in enumerate(old)]
    for i, s in enumerate(old):
        checkpoint(s, 2, [f"{i}-b"], complete=False)  # pending
        s.write(f"{i}-c")  # in progress
        s._handle.flush()
    # the new attempt's subtask 1 already runs and snapshotted checkpoint 3 when subtask 0 starts
    live = attempt(target.sink(), job=5, restore_from=1, states=[states[1]], subtask=1, parallelism=2)
    checkpoint(live, 3, ["1-b", "1-c"], complete=False)
    attempt(target.sink(), job=5, restore_from=1, states=[states[0]], subtask=0, parallelism=2)
    pending = sorted(f.name for f in (target.dir / ".pending").iterdir())
    assert pending == ["part-5-1-00000003.jsonl"], pending
    assert list((target.dir / ".inprogress").iterdir()) == []
    assert target.content() == ["0-a", "1-a"]
