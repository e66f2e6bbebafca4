"""Savepoints on Spark: stop a running pipeline with a savepoint (SDK and CLI), start it again from the savepoint
or from a named older checkpoint; the output across both runs is exactly once."""

from __future__ import annotations

import json
import threading
import time

import pytest
from typer.testing import CliRunner

from cli.main import app
from client.sync import OvertakeClient
from contract.models import CheckpointConfig
from spark_plugin.connectors import FileSink, PostgresSink
from tests.recovery.pipelines import SMALL_BUFFERS, check_exactly_once, keyed_counter
from tests.recovery.test_subtask_failures import file_rows, make_table, sink_dsn, table_rows
from tests.spark_plugin.consistency import emitted

pytestmark = [pytest.mark.spark, pytest.mark.slow]

CONFIG = CheckpointConfig(interval=400, policy="unaligned", timeout=30_000, retained=100)


def job_named(client: OvertakeClient, name: str, deadline: float = 60):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        jobs = [j for j in client.list_jobs().items if j.name == name]
        if jobs:
            return jobs[0]
        time.sleep(0.1)
    raise AssertionError(f"no job {name!r} registered within {deadline}s")


def stop_with_savepoint_via_cli(url: str, name: str, out: dict) -> None:
    """Once the job completed a checkpoint: `overtake savepoint JOB --stop`, as an operator would."""
    with OvertakeClient(url) as client:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            job = job_named(client, name)
            if job.num_completed > 0:
                break
            time.sleep(0.1)
        res = CliRunner().invoke(app, ["--url", url, "--json", "savepoint", str(job.id), "--stop"])
        out["exit"] = res.exit_code
        out["output"] = res.output
        out["savepoint"] = json.loads(res.output)["id"] if res.exit_code == 0 else None


def test_stop_with_savepoint_then_resume_from_it_commits_everything_exactly_once(
    spark, coordinator, pg_url, tmp_path
):
    dsn = sink_dsn(pg_url)
    make_table(dsn)
    count = 40_000
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()

    def pipeline():
        sink = PostgresSink(dsn, "counts", ["key", "seq", "n"], name="savepoint-stop")
        return keyed_counter("savepoint-stop", count, sink, pid_dir)

    stopper: dict = {}
    t = threading.Thread(target=stop_with_savepoint_via_cli, args=(coordinator.url, "savepoint-stop", stopper))
    t.start()
    first = pipeline().run(spark, coordinator.url, checkpoint=CONFIG, network=SMALL_BUFFERS)
    t.join(30)
    assert stopper["exit"] == 0, stopper["output"]
    savepoint = stopper["savepoint"]
    assert first.status == "job finished"
    with OvertakeClient(coordinator.url) as client:
        job = client.get_job(first.job_id)
        sp = client.get_checkpoint(first.job_id, savepoint)
        assert job.status.value == "FINISHED"
        assert job.status_message == f"stopped with savepoint {savepoint}"
        assert sp.is_savepoint and sp.status.value == "COMPLETED" and sp.checkpoint_type.value == "savepoint"
        total_emitted = sum(emitted(s.source_offsets) for s in client.restore_plan(first.job_id, savepoint).subtasks
                      if s.vertex == "src")
    assert 0 < total_emitted < count, "the savepoint should stop the run before its sources ended"
    # everything up to the savepoint is committed; nothing after it
    check_exactly_once_prefix(table_rows(dsn), total_emitted)

    second = pipeline().run(
        spark, coordinator.url, checkpoint=CONFIG, network=SMALL_BUFFERS, job_id=first.job_id,
        restore_from=savepoint,
    )
    assert second.status == "finished"
    assert second.attempt == first.attempt + 1
    assert second.restore_plan.checkpoint_id == savepoint and second.restore_plan.is_savepoint
    check_exactly_once(table_rows(dsn), count)


def check_exactly_once_prefix(rows, emitted_total: int) -> None:
    """Rows committed by a run stopped with a savepoint: exactly the records the sources had emitted by then."""
    assert len(rows) == emitted_total
    assert len({(k, s) for k, s, _ in rows}) == len(rows)
    per_key: dict[int, list[int]] = {}
    for k, _, n in rows:
        per_key.setdefault(k, []).append(n)
    for k, ns in per_key.items():
        assert sorted(ns) == list(range(1, len(ns) + 1)), f"key {k}: counts with gaps or repeats"


def test_a_pipeline_started_from_a_named_older_checkpoint_writes_its_files_exactly_once(spark, coordinator, tmp_path):
    """The first run committed the output of several checkpoints; the second starts from the oldest, so the
    file sink withdraws the output of the later ones and writes it again: exactly once across both runs."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    out = tmp_path / "out"
    first = keyed_counter("named-restore", None, FileSink(str(out)), pid_dir).run(
        spark, coordinator.url, checkpoint=CONFIG, network=SMALL_BUFFERS, stop_after_checkpoints=3, finish=False,
    )
    with OvertakeClient(coordinator.url) as client:
        done = sorted(c.id for c in client.list_checkpoints(first.job_id, status="COMPLETED").items)
        assert len(done) >= 2
        named = done[0]  # not the latest
        plan = client.restore_plan(first.job_id, named)
    later = {f.name for f in out.glob("part-*.jsonl") if int(f.stem.rsplit("-", 1)[1]) > named}
    assert later, "the first run should have committed output after the named checkpoint"
    total_emitted = sum(emitted(s.source_offsets) for s in plan.subtasks if s.vertex == "src")
    count = total_emitted + 6_000
    second = keyed_counter("named-restore", count, FileSink(str(out)), pid_dir).run(
        spark, coordinator.url, checkpoint=CONFIG, network=SMALL_BUFFERS, job_id=first.job_id, restore_from=named,
    )
    assert second.status == "finished"
    assert second.restore_plan.checkpoint_id == named and second.restore_plan.fallbacks == []
    withdrawn = {n for s in second.subtasks for n in (s.outputs.get("out") or {}).get("withdrawn", [])}
    assert withdrawn == later
    check_exactly_once(file_rows(out), count)
