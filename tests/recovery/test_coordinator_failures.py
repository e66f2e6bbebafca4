"""The coordinator fails: it is SIGKILLed during a checkpoint and started again on the same port and data, or a
channel-state blob of the latest checkpoint is corrupt on disk. Nothing completed is lost, ids continue, the
pipeline goes on, a corrupt checkpoint is passed over with the reason, and the output stays exactly once (in
PostgreSQL, across the run that committed the corrupt checkpoint's output and the run that fell back past it)."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from client.sync import OvertakeClient
from contract.models import CheckpointConfig
from spark_plugin.connectors import CollectSink, FileSink, PostgresSink
from spark_plugin.driver.restart import FixedDelay
from spark_plugin.driver.run import run_pipeline
from spark_plugin.driver.supervisor import Supervisor
from tests.recovery.pipelines import RELEASE, SMALL_BUFFERS, check_exactly_once, keyed_counter
from tests.recovery.test_subtask_failures import file_rows, make_table, sink_dsn, table_rows
from tests.spark_plugin.consistency import emitted

KILLS = int(os.environ.get("OVERTAKE_COORDINATOR_KILLS", "6"))

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def config(policy: str = "unaligned") -> CheckpointConfig:
    return CheckpointConfig(interval=300, policy=policy, timeout=30_000, retained=100)


def completed_ids(client: OvertakeClient, job_id: int) -> list[int]:
    return sorted(c.id for c in client.list_checkpoints(job_id, status="COMPLETED", limit=500).items)


class CoordinatorKiller:
    """Once the job completed ``after`` checkpoints and has one pending, SIGKILL the coordinator, start it again,
    and once a checkpoint triggered after the kill completed (or at the latest after ``settle`` seconds), let the held
    sources of ``pid_dir`` end the run: without the hold a fast run could end before any checkpoint completed after
    the restart (a CI run ended 12.6 s in with none)."""

    def __init__(self, live, name: str, pid_dir: str, after: int = 2, down: float = 1.0, settle: float = 60.0) -> None:
        self.live, self.name, self.pid_dir, self.after, self.down, self.settle = live, name, pid_dir, after, down, settle
        self.before: list[int] = []
        self.pending_at_kill: int | None = None
        self.job_id: int | None = None
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
                            self.job_id = jobs[0].id
                            self.before = completed_ids(c, jobs[0].id)
                            self.pending_at_kill = pending[0].id
                            self.live.kill()
                            break
                    time.sleep(0.02)
            time.sleep(self.down)
            self.live.start()
            if self.job_id is not None:
                with OvertakeClient(self.live.url) as c:
                    end = time.monotonic() + self.settle
                    while time.monotonic() < end:
                        if any(i > self.pending_at_kill for i in completed_ids(c, self.job_id)):
                            break
                        time.sleep(0.05)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e
        finally:
            (Path(self.pid_dir) / RELEASE).touch()  # the run ends whatever happened here


def test_a_coordinator_killed_during_a_checkpoint_loses_nothing_and_the_pipeline_goes_on(spark, fresh_coordinator):
    live = fresh_coordinator.start()
    count = 30_000
    pid_dir = _pids()
    killer = CoordinatorKiller(live, "coordinator-kill", pid_dir)
    killer.thread.start()
    pipeline = keyed_counter("coordinator-kill", count, CollectSink(), pid_dir, held=True)
    result = Supervisor(pipeline, FixedDelay(3, 0.5)).run(spark, live.url, checkpoint=config(), network=SMALL_BUFFERS)
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


class CoordinatorBouncer:
    """SIGKILLs the coordinator ``kills`` times at random moments and starts it again on the same port and data
    after ``down`` seconds (random in the range), then lets held sources end the run."""

    def __init__(self, live, pid_dir, kills: int, seed: int, up=(1.0, 3.0), down=(2.0, 5.0)) -> None:
        self.live, self.pid_dir, self.kills = live, pid_dir, kills
        self.rng = random.Random(seed)
        self.up, self.down = up, down
        self.downtimes: list[float] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while len(self.downtimes) < self.kills:
                time.sleep(self.rng.uniform(*self.up))
                self.live.kill()
                t0 = time.monotonic()
                time.sleep(self.rng.uniform(*self.down))
                self.live.start()
                self.downtimes.append(time.monotonic() - t0)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e
        finally:
            (Path(self.pid_dir) / RELEASE).touch()


def test_a_pipeline_whose_coordinator_is_killed_again_and_again_finishes_exactly_once(
    spark, fresh_coordinator, tmp_path
):
    """No supervisor: the subtasks keep reconnecting their event streams and retrying their acks while the
    coordinator is down, so the run never fails and never hangs; the file sink's output is exactly once."""
    live = fresh_coordinator.start()
    pid_dir, out = tmp_path / "pids", tmp_path / "out"
    pid_dir.mkdir()
    count = 30_000
    bouncer = CoordinatorBouncer(live, pid_dir, kills=KILLS, seed=7)
    pipeline = keyed_counter("coordinator-bounce", count, FileSink(str(out)), pid_dir, held=True)
    bouncer.thread.start()
    result = run_pipeline(pipeline, spark, live.url, checkpoint=config(), network=SMALL_BUFFERS)
    bouncer.thread.join(60)
    assert bouncer.error is None, bouncer.error
    assert len(bouncer.downtimes) == KILLS, f"only {len(bouncer.downtimes)} of {KILLS} kills landed"
    assert result.status == "finished"
    with OvertakeClient(live.url) as c:
        job = c.get_job(result.job_id)
    assert job.status.value == "FINISHED" and job.current_attempt == 1  # one attempt: nothing was restarted
    check_exactly_once(file_rows(out), count)


def test_a_coordinator_down_longer_than_the_subtasks_wait_fails_the_run_and_the_supervisor_restarts_it(
    spark, fresh_coordinator, tmp_path
):
    """Past ``max_coordinator_outage`` a subtask fails loudly instead of waiting for ever; the supervisor then
    restarts the pipeline from the latest completed checkpoint once the coordinator is back."""
    live = fresh_coordinator.start()
    pid_dir, out = tmp_path / "pids", tmp_path / "out"
    pid_dir.mkdir()
    count = 20_000
    bouncer = CoordinatorBouncer(live, pid_dir, kills=1, seed=3, up=(2.0, 2.5), down=(6.0, 6.5))
    pipeline = keyed_counter("coordinator-gone", count, FileSink(str(out)), pid_dir, held=True)
    bouncer.thread.start()
    result = Supervisor(pipeline, FixedDelay(max_restarts=5, delay=1.0)).run(
        spark, live.url, checkpoint=config(), network=SMALL_BUFFERS, max_coordinator_outage=2.0
    )
    bouncer.thread.join(60)
    assert bouncer.error is None, bouncer.error
    assert result.status == "finished"
    assert result.restarts, "the outage did not fail the run"
    check_exactly_once(file_rows(out), count)


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
    """One byte of a checkpoint's channel state flips in the store after the first run committed that checkpoint's
    output to PostgreSQL. The restore plan checks sizes only (a stat), so the restoring subtask finds the sha256
    mismatch as it reads, reports the blob and fails; the supervisor's next attempt falls back past the checkpoint
    (naming the blob), the sink withdraws the passed-over output and the run writes it again: exactly once."""
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
        plan = c.restore_plan(first.job_id, corrupt)
    previous = max(i for i in done if i < corrupt)
    committed = sink_markers(dsn, first.job_id)
    assert corrupt in committed, f"the first run should have committed checkpoint {corrupt}'s output: {committed}"
    rows_before = len(table_rows(dsn))
    # the subtask wrote its state straight into the store: the blob is a range of its object there
    (loc,) = [b for s in plan.subtasks for b in s.blobs if b.blob_id == blob_id]
    assert loc.url is not None and loc.url.startswith("file://"), loc
    path = Path(unquote(urlparse(loc.url).path))
    assert path.is_relative_to(coordinator.data_dir / "blobs" / f"job-{first.job_id}" / f"cp-{corrupt:012d}")
    data = bytearray(path.read_bytes())
    data[loc.offset + loc.size // 2] ^= 0xFF
    path.write_bytes(bytes(data))

    total_emitted = sum(emitted(s.source_offsets) for s in plan.subtasks if s.vertex == "src")
    count = total_emitted + 5_000
    second = Supervisor(keyed_counter(name, count, sink(), _pids()), FixedDelay(max_restarts=2, delay=0.5)).run(
        spark, coordinator.url, checkpoint=config(), network=SMALL_BUFFERS, job_id=first.job_id,
        restore_from=corrupt,
    )
    assert second.status == "finished"
    (restart,) = second.restarts
    assert f"blob {blob_id} is corrupt" in restart.error, restart.error
    restored = second.restore_plan
    assert restored.checkpoint_id == previous
    assert [fb.checkpoint_id for fb in restored.fallbacks] == [corrupt]
    assert blob_id in restored.fallbacks[0].reason
    assert sink_markers(dsn, first.job_id) >= {previous}, "the passed-over output was not withdrawn and rewritten"
    assert rows_before > 0
    check_exactly_once(table_rows(dsn), count)
