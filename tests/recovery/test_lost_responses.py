"""A request retried after its response was lost changes nothing: the coordinator is idempotent.

The client's transport delivers the request, reads the coordinator's answer and then drops it (``ReadError``),
as when a connection dies on the way back; the SDK retries the same request, so the coordinator sees it twice.
"""

from __future__ import annotations

import os

import httpx
import pytest

from client.sync import OvertakeClient
from contract.models import AckMetrics, BlobRef, SubtaskAck
from tests.client._jobs import SUBTASKS, job_spec, state_of, upload_and_ack


class LoseResponses(httpx.HTTPTransport):
    """Delivers every request; the answer of the first request whose path ends with ``suffix`` is lost."""

    def __init__(self, suffix: str) -> None:
        super().__init__()
        self.suffix = suffix
        self.delivered: list[tuple[str, int]] = []
        self.lost = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.url.path.endswith(self.suffix):
            response.read()
            self.delivered.append((request.url.path, response.status_code))
            if self.lost == 0:
                self.lost += 1
                response.close()
                raise httpx.ReadError("connection reset after the request was delivered", request=request)
        return response


@pytest.fixture
def job(coordinator):
    with OvertakeClient(coordinator.url) as admin:
        job = admin.create_job(job_spec())
        attempt = admin.start_attempt(job.id)
        cp = admin.trigger_checkpoint(job.id)
    return job, attempt, cp


def blob_files(coordinator, job_id: int) -> list[str]:
    """The blob objects stored for a job, by file name (each under its checkpoint's prefix)."""
    d = coordinator.data_dir / "blobs" / f"job-{job_id}"
    # os.walk, not rglob: a checkpoint's directory deleted by the cleaning meanwhile is skipped, not an error
    return sorted(f.split(".")[0] for _, _, files in os.walk(d) for f in files)


def test_an_upload_retried_after_its_response_was_lost_stores_the_blob_once(coordinator, job):
    job, attempt, cp = job
    lossy = LoseResponses("/blobs")
    with OvertakeClient(coordinator.url, transport=lossy, backoff=0.01) as c:
        info = c.upload_blob(job.id, cp.id, attempt=attempt.attempt, vertex="src", subtask_index=0,
                             kind="operator", data=state_of(cp.id, "src", 0))
    assert [status for _, status in lossy.delivered] == [201, 200]  # stored, then found stored
    assert blob_files(coordinator, job.id) == [info.blob_id]
    with OvertakeClient(coordinator.url) as c:
        assert c.download_blob(job.id, info.blob_id) == state_of(cp.id, "src", 0)


def test_the_last_ack_retried_after_its_response_was_lost_completes_the_checkpoint_once(coordinator, job):
    job, attempt, cp = job
    with OvertakeClient(coordinator.url) as c:
        for vertex, index in SUBTASKS[:-1]:
            upload_and_ack(c, attempt, cp, vertex, index)
        vertex, index = SUBTASKS[-1]
        info = c.upload_blob(job.id, cp.id, attempt=attempt.attempt, vertex=vertex, subtask_index=index,
                             kind="operator", data=state_of(cp.id, vertex, index))
    ack = SubtaskAck(
        attempt=attempt.attempt, vertex=vertex, subtask_index=index,
        operator_state=BlobRef(blob_id=info.blob_id, sha256=info.sha256, size=info.size),
        metrics=AckMetrics(sync_duration=1, async_duration=2, processed_data=10),
    )
    lossy = LoseResponses("/acks")
    with OvertakeClient(coordinator.url, transport=lossy, backoff=0.01) as c:
        result = c.ack(job.id, cp.id, ack)
    assert len(lossy.delivered) == 2 and all(status == 200 for _, status in lossy.delivered)
    assert result.duplicate is True  # the first delivery recorded it and completed the checkpoint
    assert result.status.value == "COMPLETED"
    assert result.num_acknowledged_subtasks == result.num_subtasks == len(SUBTASKS)
    with OvertakeClient(coordinator.url) as c:
        detail = c.get_checkpoint(job.id, cp.id)
        events = c.event_history(job.id)
        again = c.trigger_checkpoint(job.id)
    assert detail.status.value == "COMPLETED" and detail.num_acknowledged_subtasks == len(SUBTASKS)
    completed = [e for e in events if e.type.value == "checkpoint.completed"]
    assert [e.data["checkpoint_id"] for e in completed] == [cp.id]
    assert again.id == cp.id + 1


def test_a_report_with_its_state_retried_after_its_response_was_lost_stores_once_and_completes_once(
    coordinator, job
):
    job, attempt, cp = job
    with OvertakeClient(coordinator.url) as c:
        for vertex, index in SUBTASKS[:-1]:
            upload_and_ack(c, attempt, cp, vertex, index)
    before = blob_files(coordinator, job.id)
    vertex, index = SUBTASKS[-1]
    in_flight = b"buffers the barrier overtook" * 100
    report = {
        "attempt": attempt.attempt, "vertex": vertex, "subtask_index": index,
        "channel_segments": [{"channel": "in:x", "direction": "input", "offset": 0, "length": len(in_flight),
                              "buffer_count": 1, "record_count": 100}],
    }
    lossy = LoseResponses("/acks/with-state")
    with OvertakeClient(coordinator.url, transport=lossy, backoff=0.01) as c:
        result = c.ack_with_state(job.id, cp.id, report, operator_state=state_of(cp.id, vertex, index),
                                  channel_state=in_flight)
    assert [status for _, status in lossy.delivered] == [200, 200]
    assert result.duplicate is True and result.status.value == "COMPLETED"
    assert len(blob_files(coordinator, job.id)) == len(before) + 2  # operator and channel blob, once each
    with OvertakeClient(coordinator.url) as c:
        events = c.event_history(job.id)
        (entry,) = [e for e in c.channel_state(job.id, cp.id).entries if e.vertex == vertex]
        assert c.download_blob(job.id, entry.blob_id) == in_flight
    completed = [e for e in events if e.type.value == "checkpoint.completed"]
    assert [e.data["checkpoint_id"] for e in completed] == [cp.id]
