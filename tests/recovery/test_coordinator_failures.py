"""The coordinator fails: it is SIGKILLed during a checkpoint and started again on the same port and data, or a
channel-state blob of the latest checkpoint is corrupt on disk. Nothing completed is lost, ids continue, the
pipeline goes on, a corrupt checkpoint is passed over with the reason, and the output stays exactly once (in
PostgreSQL, across the run that committed the corrupt checkpoint's output and the run that fell back past it)."""

from __future__ import annotations

import threading
import time

import pytest

from client.models import CheckpointConfig
from client.sync import OvertakeClient
from spark_plugin.connectors import PostgresSink
from spark_plugin.execution import run_pipeline
from spark_plugin.restart import FixedDelay
from spark_plugin.sinks import CollectSink
from spark_plugin.supervisor import Supervisor
from tests.recovery.pipelines import SMALL_BUFFERS, check_exactly_once, keyed_counter
from tests.recovery.test_subtask_failures import make_table, sink_dsn, table_rows

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def config(policy: str = "unaligned") -> CheckpointConfig:
    return CheckpointConfig(interval=300, policy=policy, timeout=30_000, retained=100)


def completed_ids(client: OvertakeClient, job_id: int) -> list[int]:
    return sorted(c.id for c in client.list_checkpoints(job_id, status="COMPLETED", limit=500).items)


class CoordinatorKiller:
    """Once the job completed ``after`` checkpoints and has one pending, SIGKILL the coordinator, start it again."""

    def __init__(self, live, name: str, after: int = 2, down: float = 1.0) -> None:
        self.live, self.name, self.after, self.down = live, name, after, down
        self.before: list[int] = []
        self.pending_at_kill: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with OvertakeClient(self.live.url) as c:
                end = time.monotonic() + 120
                while time.monotonic() < end:
                    jobs = [j for j in c.list_jobs().items if j.name == self.name]
                    if jobs and jobs[0].num_completed >= self.after:
                        pending = c.list_checkpoints(jobs[0].id, status="PENDING").items
                        if pending:
                            self.before = completed_ids(c, jobs[0].id)
                            self.pending_at_kill = pending[0].id
                            self.live.kill()
                            break
                    time.sleep(0.02)
            time.sleep(self.down)
            self.live.start()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


def test_a_coordinator_killed_during_a_checkpoint_loses_nothing_and_the_pipeline_goes_on(spark, fresh_coordinator):
    live = fresh_coordinator.start()
    count = 30_000
    killer = CoordinatorKiller(live, "coordinator-kill")
    killer.thread.start()
    result = Supervisor(keyed_counter("coordinator-kill", count, CollectSink(), _pids()), FixedDelay(3, 0.5)).run(
        spark, live.url, checkpoint=config(), network=SMALL_BUFFERS
    )
    killer.thread.join(30)
    assert killer.error is None, killer.error
    assert killer.pending_at_kill is not None, "the job ended before a checkpoint was pending"
    assert result.status == "finished"
    with OvertakeClient(live.url) as c:
        after = completed_ids(c, result.job_id)
        job = c.get_job(result.job_id)
    assert set(killer.before) <= set(after), "a checkpoint completed before the kill was lost"
    later = [i for i in after if i > killer.pending_at_kill]
    assert later, "no checkpoint completed after the coordinator came back"
    assert job.status.value == "FINISHED"
    check_exactly_once(result.outputs("out"), count)


def _pids():
    import tempfile

    return tempfile.mkdtemp(prefix="overtake-pids-")


def sink_markers(dsn: str, job_id: int) -> set[int]:
    """Checkpoints whose output the PostgreSQL sink committed for the job."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT checkpoint_id FROM overtake_sink_commits WHERE job_id = %s", (job_id,))
        return {r[0] for r in rows}


def test_a_corrupt_channel_state_blob_makes_recovery_fall_back_and_the_output_stays_exactly_once(
    spark, coordinator, pg_url
):
    """The output of the corrupt checkpoint was already committed to PostgreSQL by the first run; the restore
    falls back past it, the sink withdraws that output and the second run writes it again: exactly once."""
    dsn = sink_dsn(pg_url)
    make_table(dsn)
    name = "corrupt-blob"

    def sink() -> PostgresSink:
        return PostgresSink(dsn, "counts", ["key", "seq", "n"], name=name)

    first = keyed_counter(name, None, sink(), _pids(), delay=0.001).run(
        spark, coordinator.url, checkpoint=config(), network=SMALL_BUFFERS, stop_after_checkpoints=4, finish=False
    )
    with OvertakeClient(coordinator.url) as c:
        done = completed_ids(c, first.job_id)
        with_state = [
            (cid, e.blob_id)
            for cid in reversed(done)
            if any(i < cid for i in done)
            for e in c.channel_state(first.job_id, cid).entries
            if e.segments and any(s.length for s in e.segments)
        ]
    assert with_state, "no completed unaligned checkpoint (after the first) persisted in-flight data"
    corrupt, blob_id = with_state[0]
    previous = max(i for i in done if i < corrupt)
    committed = sink_markers(dsn, first.job_id)
    assert corrupt in committed, f"the first run should have committed checkpoint {corrupt}'s output: {committed}"
    rows_before = len(table_rows(dsn))
    path = coordinator.data_dir / "blobs" / f"job-{first.job_id}" / blob_id
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))

    with OvertakeClient(coordinator.url) as c:
        plan = c.restore_plan(first.job_id, corrupt)
        emitted = sum(s.source_offsets["emitted"] for s in plan.subtasks if s.vertex == "src")
    count = emitted + 5_000
    second = run_pipeline(
        keyed_counter(name, count, sink(), _pids()), spark, coordinator.url, checkpoint=config(),
        network=SMALL_BUFFERS, job_id=first.job_id, restore_from=corrupt,
    )
    assert second.status == "finished"
    restored = second.restore_plan
    assert restored.checkpoint_id == previous
    assert [fb.checkpoint_id for fb in restored.fallbacks] == [corrupt]
    assert blob_id in restored.fallbacks[0].reason
    withdrawn = sorted({c for s in second.subtasks for c in (s.outputs.get("out") or {}).get("withdrawn_checkpoints", [])})
    assert withdrawn == sorted(i for i in committed if i > previous), "the passed-over output was not withdrawn"
    assert rows_before > 0
    check_exactly_once(table_rows(dsn), count)
