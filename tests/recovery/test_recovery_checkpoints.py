"""Checkpoints during recovery under real failures: a subtask is SIGKILLed under backpressure after a checkpoint with
much in-flight data completed; the next attempt restores it and, while it replays that data, completes a checkpoint
of its own; a second SIGKILL lands right then. The third attempt restores the checkpoint taken during the replay (not
the first one), and the sink holds every record exactly once, in order per key.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from client.sync import OvertakeClient
from contract.models import CheckpointConfig
from spark_plugin.connectors import FileSink
from spark_plugin.driver.restart import FixedDelay
from spark_plugin.driver.supervisor import Supervisor
from spark_plugin.network.config import NetworkConfig
from spark_plugin.network.framing import decode_records
from spark_plugin.task.channel_state import ChannelStateReader
from spark_plugin.task.state_store import BlobReader
from tests.recovery.pipelines import WorkerKiller, check_exactly_once, keyed_counter

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TASKS = 4
COUNT = 60_000
LARGE_IN_FLIGHT = NetworkConfig(  # senders hold only their receivers' credit plus one buffer: the depth is here
    buffer_size=4096, exclusive_buffers_per_channel=32, floating_buffers_per_gate=16, max_buffers_per_output_channel=20,
    checkpoints_during_recovery=True,
)
ENOUGH_IN_FLIGHT = 32 * 1024
"""Bytes of in-flight data the first kill waits for in a completed checkpoint (the restore then replays seconds)."""


class KillDuringReplay(WorkerKiller):
    """Kill 1: once the first attempt completed a checkpoint holding ``ENOUGH_IN_FLIGHT`` bytes of in-flight data.
    Kill 2: as soon as the second attempt, which replays that data, completed a checkpoint of its own."""

    def __init__(self, pid_dir, url: str, seed: int) -> None:
        super().__init__(pid_dir, TASKS, kills=2, seed=seed)
        self.url = url
        self.job_id: int | None = None
        self.first_restore: int | None = None

    def _completed(self, client: OvertakeClient, attempt: int) -> list:
        if self.job_id is None:
            jobs = [j for j in client.list_jobs(limit=1000).items if j.name == "during-recovery"]
            if not jobs:
                return []
            self.job_id = max(j.id for j in jobs)
        items = client.list_checkpoints(self.job_id, status="COMPLETED", limit=1000).items
        return [c for c in items if c.attempt == attempt]

    def _kill_when(self, stage_after: str, ready, patience: float = 60.0) -> str | None:
        """Wait for a stage newer than ``stage_after`` whose tasks are up and for ``ready()``; kill one of its tasks.
        After ``patience`` seconds it gives up (the test then fails on the kills that landed, instead of hanging)."""
        give_up = time.monotonic() + patience
        while not self.stop.is_set() and time.monotonic() < give_up:
            stages = self._stages()
            newer = sorted(s for s, files in stages.items() if s > stage_after and self._up(files))
            if newer and ready():
                stage = newer[-1]
                victim = self.rng.choice(sorted(stages[stage]))
                pid = int(victim.read_text())
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    return None
                self.killed.append((victim.name, pid))
                return stage
            self.stop.wait(0.05)
        return None

    def _run(self) -> None:
        with OvertakeClient(self.url) as client:
            first = self._kill_when(
                "", lambda: any(c.persisted_data >= ENOUGH_IN_FLIGHT for c in self._completed(client, 1))
            )
            if first is not None:
                self._kill_when(first, lambda: bool(self._completed(client, 2)))
        self._release()


def in_flight(client: OvertakeClient, job_id: int, checkpoint_id: int) -> set[int]:
    """The seqs of the records a checkpoint holds as channel state (input and output, every subtask)."""
    plan = client.restore_plan(job_id, checkpoint_id)
    seqs: set[int] = set()
    for sub in plan.subtasks:
        reader = BlobReader(sub.blobs, lambda blob_id: client.download_blob(job_id, blob_id))
        for seg in sub.input_channel_state + sub.output_channel_state:
            for buf in ChannelStateReader(reader.blob(seg.blob_id)).segment_buffers(seg):
                seqs.update(r[1] for r in decode_records(buf) if isinstance(r, tuple))
    return seqs


def test_a_second_kill_during_a_long_replay_restores_the_checkpoint_taken_during_it(spark, coordinator, tmp_path):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    out = tmp_path / "out"
    pipeline = keyed_counter("during-recovery", COUNT, FileSink(str(out)), pid_dir, held=True)
    checkpoint = CheckpointConfig(interval=400, policy="unaligned", timeout=30_000,
                                  retained=1000)  # both restored checkpoints are read back at the end
    with KillDuringReplay(pid_dir, coordinator.url, seed=7) as killer:
        result = Supervisor(pipeline, FixedDelay(max_restarts=4, delay=0.2)).run(
            spark, coordinator.url, checkpoint=checkpoint, network=LARGE_IN_FLIGHT
        )
    assert result.status == "finished"
    assert len(killer.killed) == 2, f"only {len(killer.killed)} of 2 kills landed"
    with OvertakeClient(coordinator.url) as client:
        by_id = {c.id: c for c in client.list_checkpoints(result.job_id, limit=1000).items}
    first, second = result.restarts[0], result.restarts[1]
    # (the newest of the first attempt: the one the killer waited for, or one completed in the moment before the kill)
    assert by_id[first.restored].attempt == 1 and by_id[first.restored].persisted_data > 0
    # the second failure did not start over from the first checkpoint: it restored one of the attempt that replayed
    assert by_id[second.restored].attempt == 2, (first, second)
    # ... taken while it replayed: records in flight at the first checkpoint were still in flight at that one
    with OvertakeClient(coordinator.url) as client:
        again = in_flight(client, result.job_id, first.restored) & in_flight(client, result.job_id, second.restored)
    assert again, f"checkpoint {second.restored} was not taken during the replay of checkpoint {first.restored}"
    rows = [tuple(json.loads(line)) for f in sorted(out.glob("part-*.jsonl")) for line in f.read_text().splitlines()]
    check_exactly_once(rows, COUNT)
