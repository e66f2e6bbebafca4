"""Rescaling on Spark: a pipeline with two keyed stages runs, stops with a checkpoint taken under backpressure (an
unaligned checkpoint, or a savepoint), and runs again as the same job with other parallelism: 2->5, 3->2 and 4->1
for each keyed stage across the scenarios, the sources rescaled too in one, SIGKILLs in the rescaled run in another.
The sink ends up with every record exactly once, each stage counted each key without gaps or repeats, a source
split's records reached the first stage in order, and each key crossed the second shuffle in order.
"""

from __future__ import annotations

import threading
import time

import pytest

from client.sync import OvertakeClient
from contract.models import CheckpointConfig
from spark_plugin import FixedDelay, Pipeline, PipelineError
from spark_plugin.connectors import FileSink, PostgresSink, SequenceSource
from spark_plugin.driver.supervisor import Supervisor
from tests.recovery.pipelines import WorkerKiller, check_two_stages_exactly_once, two_keyed_stages
from tests.recovery.test_subtask_failures import sink_dsn
from tests.spark_plugin.consistency import emitted

pytestmark = [pytest.mark.spark, pytest.mark.slow]

UNALIGNED = CheckpointConfig(interval=300, policy="unaligned", timeout=30_000, retained=100)
SPLITS = 2  # the sources' parallelism on the first run: the number of sequence splits


def file_rows(directory) -> list[tuple[int, int, int, int]]:
    import json

    return [tuple(json.loads(line)) for f in sorted(directory.glob("part-*.jsonl")) for line in f.read_text().splitlines()]


def in_flight_bytes(client: OvertakeClient, job_id: int, checkpoint_id: int) -> int:
    return client.get_checkpoint(job_id, checkpoint_id).persisted_data


def latest_completed(client: OvertakeClient, job_id: int) -> int:
    return max(c.id for c in client.list_checkpoints(job_id, status="COMPLETED", limit=500).items)


def first_run_until_checkpoints(spark, url, name, sink, pid_dir, parallelism, checkpoints=4):
    """The first run: unbounded sources under backpressure until ``checkpoints`` checkpoints completed; the job
    stays open."""
    first = two_keyed_stages(name, None, sink, pid_dir, parallelism).run(
        spark, url, checkpoint=UNALIGNED, stop_after_checkpoints=checkpoints, finish=False
    )
    assert first.status == "checkpoint limit", first.status
    return first


def count_covering(client: OvertakeClient, job_id: int, checkpoint_id: int, more: int = 6_000) -> int:
    """A record count for the bounded second run that covers every split past where the checkpoint left it."""
    plan = client.restore_plan(job_id, checkpoint_id)
    positions = [k for s in plan.subtasks if s.vertex == "src"
                 for k in SequenceSource.emitted_per_split(s.source_offsets).values()]
    return SPLITS * max(positions) + more


def assert_rescaled(plan, changes: dict[str, tuple[int, int]]) -> None:
    got = {r.vertex: (r.old_parallelism, r.new_parallelism) for r in plan.rescaled}
    assert got == changes, got


def test_rescale_out_and_in_from_an_unaligned_checkpoint_with_sigkills_is_exactly_once(
    spark, coordinator, pg_url, tmp_path
):
    """count1 2->5 and count2 3->2, the sources 2->3; the rescaled run loses two workers and restarts."""
    dsn = sink_dsn(pg_url)
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE counts (key int, seq bigint, n1 int, n2 int)")

    def sink():
        return PostgresSink(dsn, "counts", ["key", "seq", "n1", "n2"], name="rescale-kill")

    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    first = first_run_until_checkpoints(spark, coordinator.url, "rescale-kill", sink(), tmp_path, (2, 2, 3))
    with OvertakeClient(coordinator.url) as c:
        restored = latest_completed(c, first.job_id)
        assert in_flight_bytes(c, first.job_id, restored) > 0, "the checkpoint persisted no in-flight data"
        count = count_covering(c, first.job_id, restored)
    pipeline = two_keyed_stages("rescale-kill", count, sink(), pid_dir, (3, 5, 2), held=True)
    with WorkerKiller(pid_dir, tasks=10, kills=2, seed=31) as killer:
        result = Supervisor(pipeline, FixedDelay(max_restarts=4, delay=0.2)).run(
            spark, coordinator.url, checkpoint=UNALIGNED, job_id=first.job_id, restore_from=restored
        )
    assert result.status == "finished"
    assert len(killer.killed) == 2 and len(result.restarts) >= 2
    with OvertakeClient(coordinator.url) as c:
        attempts = [e.data for e in c.event_history(first.job_id, limit=1000) if e.type.value == "attempt.started"]
    rescaled = {r["vertex"]: (r["old_parallelism"], r["new_parallelism"]) for r in attempts[1]["rescaled"]}
    assert attempts[1]["restored_checkpoint_id"] == restored
    assert rescaled == {"src": (2, 3), "count1": (2, 5), "count2": (3, 2)}
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT key, seq, n1, n2 FROM counts").fetchall()
    check_two_stages_exactly_once(rows, count, SPLITS)


def test_rescale_from_a_savepoint_to_one_and_out_to_five_is_exactly_once(spark, coordinator, tmp_path):
    """count1 4->1 and count2 2->5, from a savepoint taken while the job ran under backpressure."""
    out, pid_dir = tmp_path / "out", tmp_path / "pids"
    pid_dir.mkdir()
    name = "rescale-savepoint"
    stopped: dict = {}

    def stop_with_savepoint() -> None:
        with OvertakeClient(coordinator.url) as c:
            end = time.monotonic() + 90
            while time.monotonic() < end:
                jobs = [j for j in c.list_jobs().items if j.name == name]
                if jobs and jobs[0].num_completed >= 2:
                    stopped["savepoint"] = c.trigger_savepoint(jobs[0].id, stop=True).id
                    return
                time.sleep(0.1)

    t = threading.Thread(target=stop_with_savepoint)
    t.start()
    first = two_keyed_stages(name, None, FileSink(str(out)), pid_dir, (2, 4, 2)).run(
        spark, coordinator.url, checkpoint=UNALIGNED
    )
    t.join(30)
    assert first.status == "job finished" and "savepoint" in stopped
    with OvertakeClient(coordinator.url) as c:
        plan = c.restore_plan(first.job_id, stopped["savepoint"])
        assert sum(emitted(s.source_offsets) for s in plan.subtasks if s.vertex == "src") > 0
        count = count_covering(c, first.job_id, stopped["savepoint"])
    second = two_keyed_stages(name, count, FileSink(str(out)), pid_dir, (2, 1, 5)).run(
        spark, coordinator.url, checkpoint=UNALIGNED, job_id=first.job_id, restore_from=stopped["savepoint"]
    )
    assert second.status == "finished"
    assert second.restore_plan.checkpoint_id == stopped["savepoint"] and second.restore_plan.is_savepoint
    assert_rescaled(second.restore_plan, {"count1": (4, 1), "count2": (2, 5)})
    check_two_stages_exactly_once(file_rows(out), count, SPLITS)


def test_rescale_in_from_an_unaligned_checkpoint_is_exactly_once(spark, coordinator, tmp_path):
    """count1 3->2 and count2 4->1."""
    out, pid_dir = tmp_path / "out", tmp_path / "pids"
    pid_dir.mkdir()
    first = first_run_until_checkpoints(spark, coordinator.url, "rescale-in", FileSink(str(out)), pid_dir, (2, 3, 4))
    with OvertakeClient(coordinator.url) as c:
        count = count_covering(c, first.job_id, latest_completed(c, first.job_id))
    second = two_keyed_stages("rescale-in", count, FileSink(str(out)), pid_dir, (2, 2, 1)).run(
        spark, coordinator.url, checkpoint=UNALIGNED, job_id=first.job_id, restore_from="latest"
    )
    assert second.status == "finished"
    assert second.restore_plan.checkpoint_id is not None
    assert_rescaled(second.restore_plan, {"count1": (3, 2), "count2": (4, 1)})
    moved = {r.vertex: r.channel_state_bytes for r in second.restore_plan.rescaled}
    assert sum(moved.values()) > 0, "no in-flight data was redistributed"
    check_two_stages_exactly_once(file_rows(out), count, SPLITS)


def test_a_pipeline_that_differs_from_its_job_in_more_than_parallelism_is_refused_before_spark_starts(
    spark, coordinator, tmp_path
):
    first = first_run_until_checkpoints(
        spark, coordinator.url, "rescale-refused", FileSink(str(tmp_path / "out")), tmp_path, (1, 1, 1), 1
    )
    other = Pipeline("rescale-refused", parallelism=1)
    other.source(SequenceSource(count=10), id="src").rebalance().map(str, id="count1").sink(
        FileSink(str(tmp_path / "out")), id="out"
    )
    with pytest.raises(PipelineError, match=r"has vertices \['count2'\] that the pipeline lacks"):
        other.run(spark, coordinator.url, job_id=first.job_id, restore_from="latest")
    with OvertakeClient(coordinator.url) as c:
        assert c.get_job(first.job_id).current_attempt == 1  # nothing was started
