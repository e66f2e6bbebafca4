"""Killed subtask processes: for each barrier policy, SIGKILL a random subtask's Python worker several times in one
run, under backpressure; the supervisor restarts from the latest checkpoint and the sink ends up exactly right.

``OVERTAKE_FAILURE_KILLS`` sets the kills per policy (default 5). The sources hold back their last records until
every kill landed, so a fast machine cannot finish the run early.
"""

from __future__ import annotations

import json
import os

import pytest

from client.sync import OvertakeClient
from contract.models import CheckpointConfig
from spark_plugin.connectors import FileSink, PostgresSink
from spark_plugin.driver.restart import FixedDelay
from spark_plugin.driver.supervisor import Supervisor
from tests.recovery.pipelines import SMALL_BUFFERS, WorkerKiller, check_exactly_once, keyed_counter

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KILLS = int(os.environ.get("OVERTAKE_FAILURE_KILLS", "5"))
TASKS = 4  # two source chains, two counting chains


def sink_dsn(pg_url: str) -> str:
    return pg_url.replace("postgresql+asyncpg://", "postgresql://", 1)


def make_table(dsn: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE counts (key int NOT NULL, seq bigint NOT NULL, n int NOT NULL)")


def table_rows(dsn: str) -> list[tuple[int, int, int]]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT key, seq, n FROM counts").fetchall()


def file_rows(directory) -> list[tuple[int, int, int]]:
    return [tuple(json.loads(line)) for f in sorted(directory.glob("part-*.jsonl")) for line in f.read_text().splitlines()]


def checkpoint_config(policy: str) -> CheckpointConfig:
    return CheckpointConfig(
        interval=400, policy=policy, alignment_timeout=100 if policy in ("aligned_then_unaligned", "adaptive") else None,
        timeout=30_000, retained=3,
    )


def run_with_kills(spark, coordinator, name: str, policy: str, sink, pid_dir, seed: int, count: int,
                   config: CheckpointConfig | None = None, regenerated: bool = False):
    pid_dir.mkdir()
    pipeline = keyed_counter(name, count, sink, pid_dir, held=True, regenerated=regenerated)
    with WorkerKiller(pid_dir, TASKS + regenerated, KILLS, seed) as killer:
        result = Supervisor(pipeline, FixedDelay(max_restarts=KILLS + 3, delay=0.2)).run(
            spark, coordinator.url, checkpoint=config or checkpoint_config(policy), network=SMALL_BUFFERS
        )
    assert result.status == "finished"
    assert len(killer.killed) == KILLS, f"only {len(killer.killed)} of {KILLS} kills landed before the run ended"
    assert len(result.restarts) >= KILLS
    for r in result.restarts:  # each restart restored what the supervisor chose, with no blob passed over
        assert (r.restored, r.fallbacks) == (r.restore_from, []), r
    with OvertakeClient(coordinator.url) as client:
        job = client.get_job(result.job_id)
    assert job.status.value == "FINISHED"
    return result


COUNT = 30_000


@pytest.mark.parametrize("policy", ["aligned", "unaligned"])
def test_killed_subtasks_leave_postgres_output_exactly_once(spark, coordinator, pg_url, tmp_path, policy):
    dsn = sink_dsn(pg_url)
    make_table(dsn)
    sink = PostgresSink(dsn, "counts", ["key", "seq", "n"], name=f"kill-{policy}")
    result = run_with_kills(spark, coordinator, f"kill-{policy}", policy, sink, tmp_path / "pids", 11, COUNT)
    assert any(r.restored is not None for r in result.restarts), "no restart restored a checkpoint"
    check_exactly_once(table_rows(dsn), COUNT)


def test_killed_subtasks_leave_file_output_exactly_once_aligned_then_unaligned(spark, coordinator, tmp_path):
    out = tmp_path / "out"
    result = run_with_kills(
        spark, coordinator, "kill-timeout", "aligned_then_unaligned", FileSink(str(out)), tmp_path / "pids", 23,
        COUNT,
    )
    assert any(r.restored is not None for r in result.restarts), "no restart restored a checkpoint"
    check_exactly_once(file_rows(out), COUNT)
    assert not list((out / ".pending").iterdir())


def test_killed_subtasks_leave_file_output_exactly_once_unaligned_last_barrier(spark, coordinator, tmp_path):
    # the counting subtasks snapshot on their last barrier: what the sources' barriers overtook is their input state
    out = tmp_path / "out"
    result = run_with_kills(
        spark, coordinator, "kill-last-barrier", "unaligned_last_barrier", FileSink(str(out)), tmp_path / "pids", 37,
        COUNT,
    )
    assert any(r.restored is not None for r in result.restarts), "no restart restored a checkpoint"
    check_exactly_once(file_rows(out), COUNT)
    assert not list((out / ".pending").iterdir())


def test_killed_subtasks_leave_file_output_exactly_once_with_regenerated_outputs(spark, coordinator, tmp_path):
    # a deterministic map between the sources and the counting: its last-barrier checkpoints log its inputs in place
    # of its in-flight outputs, and each restore regenerates them (the counting drops what it had processed)
    out = tmp_path / "out"
    result = run_with_kills(
        spark, coordinator, "kill-regenerated", "unaligned_last_barrier", FileSink(str(out)), tmp_path / "pids", 41,
        COUNT, regenerated=True,
    )
    assert any(r.restored is not None for r in result.restarts), "no restart restored a checkpoint"
    check_exactly_once(file_rows(out), COUNT)
    with OvertakeClient(coordinator.url) as client:
        done = [c for c in client.list_checkpoints(result.job_id, limit=1000).items
                if c.status.value == "COMPLETED" and not c.is_savepoint]
        stats = [st for c in done for st in client.get_checkpoint(result.job_id, c.id).subtasks]
    # the counting's only input is the map's edge: none of the map's outputs was persisted there, in any checkpoint;
    # what the map persisted is its input (the sources' records its barriers overtook, and its logged inputs)
    assert stats and all(st.persisted_data == 0 for st in stats if st.vertex == "count")
    assert any(st.persisted_data > 0 for st in stats if st.vertex == "regen")


def test_killed_subtasks_leave_file_output_exactly_once_adaptive(spark, coordinator, tmp_path):
    out = tmp_path / "out"
    result = run_with_kills(
        spark, coordinator, "kill-adaptive", "adaptive", FileSink(str(out)), tmp_path / "pids", 31, COUNT
    )
    assert any(r.restored is not None for r in result.restarts), "no restart restored a checkpoint"
    check_exactly_once(file_rows(out), COUNT)
    with OvertakeClient(coordinator.url) as client:
        taken = [c for c in client.list_checkpoints(result.job_id, limit=1000).items if not c.is_savepoint]
    assert taken and all(c.decision is not None and c.decision.chosen == c.policy for c in taken)


def test_killed_subtasks_with_an_inflight_budget_leave_file_output_exactly_once(spark, coordinator, tmp_path):
    # a budget of a few buffers: under backpressure some subtasks fall back to aligned, others stay unaligned
    out = tmp_path / "out"
    config = checkpoint_config("unaligned").model_copy(update={"max_inflight_bytes_per_subtask": 4096})
    result = run_with_kills(
        spark, coordinator, "kill-budget", "unaligned", FileSink(str(out)), tmp_path / "pids", 31, COUNT, config
    )
    assert any(r.restored is not None for r in result.restarts), "no restart restored a checkpoint"
    with OvertakeClient(coordinator.url) as client:
        done = [c for c in client.list_checkpoints(result.job_id, limit=1000).items if c.status.value == "COMPLETED"]
        modes = {st.unaligned for c in done for st in client.get_checkpoint(result.job_id, c.id).subtasks}
    assert modes == {True, False}, f"subtask acks were only {'un' if True in modes else ''}aligned: no mix to test"
    check_exactly_once(file_rows(out), COUNT)
    assert not list((out / ".pending").iterdir())


def test_exhausted_restarts_fail_the_job_naming_the_checkpoint_to_resume_from(spark, coordinator, tmp_path):
    from spark_plugin.connectors import DiscardSink
    from spark_plugin.driver.supervisor import RestartsExhausted

    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    pipeline = keyed_counter("kill-give-up", None, DiscardSink(), pid_dir)
    with WorkerKiller(pid_dir, TASKS, 2, seed=5, min_wait=2.0, max_wait=2.5) as killer:
        with pytest.raises(RestartsExhausted) as failed:
            pipeline.run(
                spark, coordinator.url, checkpoint=checkpoint_config("unaligned"), network=SMALL_BUFFERS,
                restart=FixedDelay(max_restarts=1, delay=0.1),
            )
    assert len(killer.killed) == 2
    with OvertakeClient(coordinator.url) as client:
        job = client.get_job(failed.value.job_id)
        completed = client.list_checkpoints(job.id, status="COMPLETED", limit=100).items
    assert job.status.value == "FAILED"
    assert str(failed.value).startswith(job.status_message)
    assert "gave up after 1 restart(s) as FixedDelay(max_restarts=1, delay=0.1) allows" in job.status_message
    assert "the Spark barrier stage failed" in job.status_message
    # read once the job was FAILED: what the coordinator holds, however late the killed tasks acknowledged
    own = [c.id for c in completed if c.attempt == failed.value.attempt]
    assert failed.value.resume_from == (max(own) if own else failed.value.restore_plan.checkpoint_id)
    if failed.value.resume_from is not None:
        assert f"it can resume from checkpoint {failed.value.resume_from}" in str(failed.value)
    else:
        assert "no checkpoint completed" in str(failed.value)
