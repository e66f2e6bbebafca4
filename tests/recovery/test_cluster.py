"""On a Spark standalone cluster (a master and two workers started from the pyspark package's own launcher, the driver
its own process as with ``spark-submit``): the backpressured keyed counter, keeping one checkpoint (``retained=1``),
loses a worker mid-run with its executor and Python workers (SIGKILL to the whole process tree, as a lost machine).
With the default restart the supervisor waits for the slots, saying so in the job's status, and runs again once a
replacement worker registers; with ``FitToSlots`` it restarts scaled down to the slots left from the latest
completed unaligned checkpoint, and scales back up from a later one once the replacement registers. Either way the
file sink's output is exactly once, each restart restored what the coordinator's attempt says it restored, and the
attempt's reason names the lost executor."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from client.sync import OvertakeClient
from tests.cluster import SparkStandalone
from tests.live import LiveCoordinator
from tests.recovery.pipelines import RELEASE, check_exactly_once
from tests.recovery.test_rescale import file_rows

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
COUNT = 20_000
DEADLINE = 300.0
"""Seconds the whole scenario may take before the test fails saying where it stood."""


def wait_for(what: str, check, timeout: float, proc: subprocess.Popen, log: Path) -> object:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        if proc.poll() is not None:
            pytest.fail(f"the driver ended (exit {proc.returncode}) while waiting for {what}; its log ends:\n"
                        f"{log.read_text(errors='replace')[-4000:]}")
        time.sleep(0.5)
    pytest.fail(f"no {what} within {timeout:.0f}s; the driver's log ends:\n{log.read_text(errors='replace')[-4000:]}")


def s3_objects(blob_url: str) -> list[str]:
    import boto3

    bucket = blob_url.removeprefix("s3://").split("/", 1)[0]
    pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


@pytest.fixture
def cluster(tmp_path):
    c = SparkStandalone(tmp_path / "spark", cores_per_worker=2, worker_memory="1g")
    try:
        yield c.start(workers=2)
    finally:
        c.stop()


class Scenario:
    """The driver (``tests.recovery.cluster_job``) against a live coordinator storing state in S3."""

    def __init__(self, cluster: SparkStandalone, s3_bucket: str, tmp_path: Path, *args: str) -> None:
        self.cluster, self.s3_bucket = cluster, s3_bucket
        self.live = LiveCoordinator(tmp_path / "coordinator", {"OVERTAKE_BLOB_URL": s3_bucket}).start()
        self.out, self.pids, self.result_file = tmp_path / "out", tmp_path / "pids", tmp_path / "result.json"
        self.log = tmp_path / "driver.log"
        self.pids.mkdir()
        with open(self.log, "wb") as log_f:
            self.driver = subprocess.Popen(
                [sys.executable, "-m", "tests.recovery.cluster_job", "--master", cluster.url, "--coordinator",
                 self.live.url, "--out", str(self.out), "--pids", str(self.pids), "--result", str(self.result_file),
                 "--count", str(COUNT), "--retained", "1", *args],
                cwd=ROOT, stdout=log_f, stderr=subprocess.STDOUT,
            )
        self.client = OvertakeClient(self.live.url)

    def job(self):
        jobs = self.client.list_jobs().items
        return jobs[0] if jobs else None

    def completed_in(self, attempt: int) -> bool:
        j = self.job()
        if j is None or j.current_attempt != attempt:
            return False
        done = self.client.list_checkpoints(j.id, status="COMPLETED", limit=500).items
        return any(c.attempt == attempt for c in done)

    def wait_for(self, what: str, check, timeout: float = 120) -> object:
        return wait_for(what, check, timeout, self.driver, self.log)

    def kill_a_worker(self) -> None:
        assert len(self.cluster.executor_pids(0)) == 1 and len(self.cluster.executor_pids(1)) == 1
        killed = self.cluster.kill_worker(0)
        assert len(killed) >= 3, killed  # the worker, its executor and the executor's Python workers

    def finish(self) -> tuple[dict, list]:
        """Let the sources end; the driver's result and the attempts API's attempts, oldest first."""
        (self.pids / RELEASE).touch()  # the held sources may now finish
        self.driver.wait(DEADLINE)
        result = json.loads(self.result_file.read_text())
        attempts = sorted(self.client.list_attempts(self.job().id).items, key=lambda a: a.attempt)
        return result, attempts

    def stop(self) -> None:
        (self.pids / RELEASE).touch()
        if self.driver.poll() is None:
            self.driver.kill()
            self.driver.wait(10)
        self.client.close()
        self.live.stop()


@pytest.fixture
def scenario(cluster, s3_bucket, tmp_path):
    started: list[Scenario] = []

    def start(*args: str) -> Scenario:
        started.append(Scenario(cluster, s3_bucket, tmp_path, *args))
        return started[0]

    try:
        yield start
    finally:
        for s in started:
            s.stop()


LOST = re.compile(r"; lost executor \d+ on [\w.-]+:\d+, worker UI [\w.-]+:\d+ \(")
"""How an attempt's reason names the executor of the killed worker: its id, address, its worker's web UI and Spark's reason."""


def check_restarts(result: dict, attempts: list, log: Path) -> None:
    """One restart (the lost worker), which restored what the coordinator's attempt restored, and whose reason says
    what was lost."""
    assert result["status"] == "finished", (result, log.read_text(errors="replace")[-4000:])
    [restart] = result["restarts"]
    assert restart["failed_attempt"] == 1 and restart["attempt"] == 2, restart
    assert LOST.search(restart["error"]), restart
    assert restart["restored"] is not None and restart["restored"] == attempts[1].restored_checkpoint_id, (
        restart, attempts)
    assert attempts[1].reason.startswith("restart 1 after: job 1 attempt 1: the Spark barrier stage failed: ")
    assert LOST.search(attempts[1].reason) and "collectAndServe" not in attempts[1].reason, attempts[1].reason


def test_a_worker_lost_mid_run_makes_the_restart_wait_for_its_slots_and_the_output_is_exactly_once(scenario):
    run = scenario()
    run.wait_for("completed checkpoint of the first attempt", lambda: run.completed_in(1))
    run.kill_a_worker()

    def waiting():
        j = run.job()
        return j.current_attempt == 2 and "waiting up to 120 s for 4 task slots (Spark offers 2" in (
            j.status_message or "")

    run.wait_for("the restart saying in the job's status that it waits for task slots", waiting)
    run.cluster.add_worker()  # the cluster manager replaces the lost machine
    run.wait_for("completed checkpoint of the restarted attempt", lambda: run.completed_in(2))
    result, attempts = run.finish()
    check_restarts(result, attempts, run.log)
    assert len(attempts) == 2 and "waiting up to 120 s for 4 task slots" in attempts[1].reason
    check_exactly_once(file_rows(run.out), COUNT)


def test_a_worker_lost_mid_run_scales_the_pipeline_down_and_back_up_exactly_once(scenario):
    run = scenario("--fit-to-slots")
    run.wait_for("completed checkpoint of the first attempt", lambda: run.completed_in(1))
    run.kill_a_worker()
    run.wait_for("completed checkpoint of the scaled-down attempt", lambda: run.completed_in(2))
    run.cluster.add_worker()  # the cluster manager replaces the lost machine
    run.wait_for("completed checkpoint at full parallelism again", lambda: run.completed_in(3))
    result, attempts = run.finish()
    in_s3 = s3_objects(run.s3_bucket)
    check_restarts(result, attempts, run.log)  # scaling back up is no restart
    check_exactly_once(file_rows(run.out), COUNT)
    # the state went straight into S3, under the job's checkpoints' prefixes; both restarts restored from there
    # (and the marker by which this deployment claimed the store)
    assert "overtake/.overtake-deployment" in in_s3, sorted(in_s3)[:5]
    in_s3 = [k for k in in_s3 if k != "overtake/.overtake-deployment"]
    assert in_s3 and all(k.startswith("overtake/job-1/cp-") for k in in_s3), sorted(in_s3)[:5]
    assert any(k.endswith(".state") for k in in_s3), sorted(in_s3)[:5]
    assert [a.restored_checkpoint_id is not None for a in attempts] == [False, True, True], attempts
    reasons = [a.reason or "" for a in attempts]
    assert "scaled down to the 2 task slots Spark offers (4 wanted)" in reasons[1], reasons
    assert reasons[2].startswith("scaled back to full parallelism where attempt 2 left off"), reasons
