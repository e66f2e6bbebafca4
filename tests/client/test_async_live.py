"""The async client against the real coordinator: the same calls, awaited."""

from __future__ import annotations

import pytest

from client.aio import AsyncOvertakeClient
from client.errors import Conflict, NotFound
from contract.models import CheckpointStatus, EventType, SubtaskAck
from tests.client._jobs import SUBTASKS, job_spec


async def test_a_checkpoint_cycle_with_the_async_client(coordinator):
    async with AsyncOvertakeClient(coordinator.url) as c:
        job = await c.create_job(job_spec())
        attempt = await c.start_attempt(job.id)
        cp = await c.trigger_checkpoint(job.id)
        for vertex, index in SUBTASKS:
            info = await c.upload_blob(
                job.id,
                cp.id,
                attempt=1,
                vertex=vertex,
                subtask_index=index,
                kind="operator",
                data=b"s" * 1000,
            )
            result = await c.ack(
                job.id,
                cp.id,
                {
                    "attempt": attempt.attempt,
                    "vertex": vertex,
                    "subtask_index": index,
                    "operator_state": {"blob_id": info.blob_id, "sha256": info.sha256, "size": info.size},
                },
            )
        assert result.status is CheckpointStatus.completed
        assert (await c.get_checkpoint(job.id, cp.id)).num_acknowledged_subtasks == 3
        seen = []
        async for event in c.events(job.id):
            seen.append(event.type)
            if event.type is EventType.checkpoint_completed:
                break
        assert seen[-2:] == [EventType.checkpoint_triggered, EventType.checkpoint_completed]
        with pytest.raises(Conflict):
            await c.ack(job.id, cp.id, SubtaskAck(attempt=1, vertex="src", subtask_index=0))
        with pytest.raises(NotFound):
            await c.get_checkpoint(job.id, cp.id + 1000)


async def test_blobs_and_acks_in_one_request_with_the_async_client(coordinator):
    async with AsyncOvertakeClient(coordinator.url) as c:
        job = await c.create_job(job_spec())
        attempt = await c.start_attempt(job.id)
        cp = await c.trigger_checkpoint(job.id)
        for vertex, index in SUBTASKS:
            result = await c.ack_with_state(
                job.id, cp.id, {"attempt": attempt.attempt, "vertex": vertex, "subtask_index": index},
                operator_state=f"{vertex}-{index}".encode() * 100,
            )
        assert result.status is CheckpointStatus.completed
        plan = await c.restore_plan(job.id)
        for s in plan.subtasks:
            (ref,) = s.operator_state
            assert await c.download_blob(job.id, ref.blob_id) == f"{s.vertex}-{s.subtask_index}".encode() * 100
