"""On a Spark standalone cluster (a master and two workers started from the pyspark package's own launcher, the driver
its own process as with ``spark-submit``): the backpressured keyed counter loses a worker mid-run with its executor
and Python workers (SIGKILL to the whole process tree, as a lost machine). The supervisor restarts it scaled down to
the slots left from the latest completed unaligned checkpoint; once a replacement worker registers it scales back up
from a later one. The file sink's output is exactly once."""

from __future__ import annotations

import json
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


def test_a_worker_lost_mid_run_scales_the_pipeline_down_and_back_up_exactly_once(cluster, s3_bucket, tmp_path):
    live = LiveCoordinator(tmp_path / "coordinator", {"OVERTAKE_BLOB_URL": s3_bucket}).start()
    out, pids, result_file, log = tmp_path / "out", tmp_path / "pids", tmp_path / "result.json", tmp_path / "driver.log"
    pids.mkdir()
    with open(log, "wb") as log_f:
        driver = subprocess.Popen(
            [sys.executable, "-m", "tests.recovery.cluster_job", "--master", cluster.url, "--coordinator", live.url,
             "--out", str(out), "--pids", str(pids), "--result", str(result_file), "--count", str(COUNT)],
            cwd=ROOT, stdout=log_f, stderr=subprocess.STDOUT,
        )
    try:
        with OvertakeClient(live.url) as client:
            def job():
                jobs = client.list_jobs().items
                return jobs[0] if jobs else None

            def completed_in(attempt: int) -> bool:
                j = job()
                if j is None or j.current_attempt != attempt:
                    return False
                done = client.list_checkpoints(j.id, status="COMPLETED", limit=500).items
                return any(c.attempt == attempt for c in done)

            wait_for("completed checkpoint of the first attempt", lambda: completed_in(1), 120, driver, log)
            assert len(cluster.executor_pids(0)) == 1 and len(cluster.executor_pids(1)) == 1
            killed = cluster.kill_worker(0)
            assert len(killed) >= 3, killed  # the worker, its executor and the executor's Python workers
            wait_for("completed checkpoint of the scaled-down attempt", lambda: completed_in(2), 120, driver, log)
            cluster.add_worker()  # the cluster manager replaces the lost machine
            wait_for("completed checkpoint at full parallelism again", lambda: completed_in(3), 120, driver, log)
            (pids / RELEASE).touch()  # the held sources may now finish
            driver.wait(DEADLINE)
            started = [e.data for e in client.event_history(job().id, limit=1000) if e.type == "attempt.started"]
        result = json.loads(result_file.read_text())
        with OvertakeClient(live.url) as client:
            in_s3 = s3_objects(s3_bucket)
            restored = [a for a in client.list_attempts(job().id).items if a.restored_checkpoint_id is not None]
    finally:
        (pids / RELEASE).touch()
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)
        live.stop()
    assert result["status"] == "finished", (result, log.read_text(errors="replace")[-4000:])
    assert len(result["restarts"]) == 1, result  # the lost worker; scaling back up is no restart
    check_exactly_once(file_rows(out), COUNT)
    # the state went straight into S3, under the job's checkpoints' prefixes; both restarts restored from there
    # (and the marker by which this deployment claimed the store)
    assert "overtake/.overtake-deployment" in in_s3, sorted(in_s3)[:5]
    in_s3 = [k for k in in_s3 if k != "overtake/.overtake-deployment"]
    assert in_s3 and all(k.startswith("overtake/job-1/cp-") for k in in_s3), sorted(in_s3)[:5]
    assert any(k.endswith(".state") for k in in_s3), sorted(in_s3)[:5]
    assert len(restored) == 2, restored
    reasons = [e.get("reason") or "" for e in started]
    assert len(reasons) == 3 and "scaled down to the 2 task slots Spark offers (4 wanted)" in reasons[1], reasons
    assert reasons[2].startswith("scaled back to full parallelism"), reasons
