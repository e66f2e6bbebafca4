"""Incremental channel state under failures: SIGKILLed subtask workers while unaligned checkpoints reference the
buffers earlier checkpoints persisted; every restore reads the referenced objects and the sink is exactly right."""

from __future__ import annotations

import pytest

from client.errors import OvertakeError
from client.sync import OvertakeClient
from contract.models import CheckpointConfig
from spark_plugin.connectors import FileSink
from spark_plugin.driver.restart import FixedDelay
from spark_plugin.driver.supervisor import Supervisor
from spark_plugin.network.config import NetworkConfig
from tests.recovery.pipelines import WorkerKiller, check_exactly_once, keyed_counter
from tests.recovery.test_subtask_failures import COUNT, KILLS, TASKS, file_rows

pytestmark = [pytest.mark.spark, pytest.mark.slow]

# Deep queues and a slower count than the other failure tests: the queues take longer to turn over than the
# checkpoint interval, so consecutive checkpoints find the same buffers in flight (sustained backpressure). Senders
# hold no more than their receivers' credit plus one buffer, so the depth comes from the receivers' buffers.
DEEP_QUEUES = NetworkConfig(buffer_size=1024, exclusive_buffers_per_channel=16, max_buffers_per_output_channel=40)
DELAY = 0.001


def referencing_checkpoints(url: str, job_id: int) -> list[int]:
    """The completed checkpoints whose channel state referenced an earlier checkpoint's objects (the manifest
    lists a collected checkpoint's segments too)."""
    found = []
    with OvertakeClient(url) as client:
        for cp in client.list_checkpoints(job_id, limit=1000).items:
            if cp.status.value != "COMPLETED":
                continue
            try:
                manifest = client.channel_state(job_id, cp.id)
            except OvertakeError:
                continue
            if any(p.key for e in manifest.entries for s in e.segments for p in s.parts or []):
                found.append(cp.id)
    return found


def test_killed_subtasks_with_incremental_channel_state_leave_file_output_exactly_once(spark, coordinator, tmp_path):
    out, pid_dir = tmp_path / "out", tmp_path / "pids"
    pid_dir.mkdir()
    pipeline = keyed_counter("kill-incremental", COUNT, FileSink(str(out)), pid_dir, delay=DELAY, held=True)
    checkpoint = CheckpointConfig(
        interval=400, policy="unaligned", timeout=30_000, retained=1, incremental_channel_state=True
    )
    with WorkerKiller(pid_dir, TASKS, KILLS, 41) as killer:
        result = Supervisor(pipeline, FixedDelay(max_restarts=KILLS + 3, delay=0.2)).run(
            spark, coordinator.url, checkpoint=checkpoint, network=DEEP_QUEUES
        )
    assert result.status == "finished"
    assert len(killer.killed) == KILLS, f"only {len(killer.killed)} of {KILLS} kills landed before the run ended"
    for r in result.restarts:  # each restart restored what the supervisor chose, with no blob passed over
        assert (r.restored, r.fallbacks) == (r.restore_from, []), r
    assert any(r.restored is not None for r in result.restarts), "no restart restored a checkpoint"
    check_exactly_once(file_rows(out), COUNT)
    assert not list((out / ".pending").iterdir())
    with OvertakeClient(coordinator.url) as client:
        assert client.get_job(result.job_id).status.value == "FINISHED"
    assert referencing_checkpoints(coordinator.url, result.job_id), "no checkpoint referenced an earlier one"
