"""Scaling on backpressure on Spark: a load that rises and falls. The keyed stage is pressed by a burst and scaled up
from the latest checkpoint, then scaled back down once the load falls; the file sink ends exactly once."""

from __future__ import annotations

import threading
import time

import pytest

from client.sync import OvertakeClient
from contract.models import CheckpointConfig
from spark_plugin import FixedDelay, Pipeline, ScaleOnBackpressure
from spark_plugin.connectors import FileSink
from spark_plugin.driver.supervisor import Supervisor
from spark_plugin.testing.failure_injection import Announce, SlowCountPerKey
from tests.recovery.pipelines import KEYS, SMALL_BUFFERS, PhasedSequenceSource, check_exactly_once
from tests.recovery.test_subtask_failures import file_rows

pytestmark = [pytest.mark.spark, pytest.mark.slow]

COUNT = 12_000
BURST = 9_000  # at ~2 ms a record, several seconds of backpressure for one counting subtask


def test_a_burst_scales_the_pressed_stage_up_and_the_quiet_after_it_back_down_exactly_once(spark, coordinator,
                                                                                            tmp_path):
    pids, out, release = tmp_path / "pids", tmp_path / "out", tmp_path / "release"
    pids.mkdir()
    p = Pipeline("pressed", parallelism=1)
    (
        p.source(PhasedSequenceSource(COUNT, KEYS, BURST, rate=60.0, release=str(release)), id="src")
        .map(Announce(str(pids)), id="announce")
        .key_by(lambda r: r[0])
        .process(SlowCountPerKey(str(pids), delay=0.002), id="count")
        .sink(FileSink(str(out)), id="out")
    )
    policy = ScaleOnBackpressure(max_parallelism=2, stabilization=3, settle=1, check_every=0.5)
    sup = Supervisor(p, FixedDelay(max_restarts=2, delay=0.2), scale_on_backpressure=policy)

    def release_after_the_scale_down():  # the quiet phase's last tenth waits for it, bounded
        end = time.monotonic() + 300
        while len(sup.scalings) < 2 and time.monotonic() < end:
            time.sleep(0.2)
        release.touch()

    releaser = threading.Thread(target=release_after_the_scale_down, daemon=True)
    releaser.start()
    try:
        result = sup.run(spark, coordinator.url, network=SMALL_BUFFERS,
                         checkpoint=CheckpointConfig(interval=300, policy="unaligned", timeout=30_000, retained=2))
    finally:
        release.touch()
        releaser.join(5)
    assert result.status == "finished" and result.restarts == []
    assert [s.target["count"] for s in result.scalings][:2] == [2, 1], result.scalings
    up, down = result.scalings[:2]
    assert up.reason.startswith("scaled up on backpressure: count 1->2: its input from src was backpressured")
    assert down.reason.startswith("scaled down, the pressure gone: count 2->1")
    with OvertakeClient(coordinator.url) as client:
        attempts = client.list_attempts(result.job_id).items
        job = client.get_job(result.job_id)
    assert job.status.value == "FINISHED"
    reasons = [a.reason or "" for a in attempts]
    assert any(r.startswith("scaled up on backpressure") for r in reasons), reasons  # the job's status said it
    assert any(r.startswith("scaled down, the pressure gone") for r in reasons), reasons
    check_exactly_once(file_rows(out), COUNT, sources=1)
    assert not list((out / ".pending").iterdir())
