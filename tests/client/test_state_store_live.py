"""The SDK and a subtask's side of state written straight into the blob store, against the real coordinator (a
uvicorn subprocess on SQLite whose file:// store is a directory this process shares, as executors do)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from client.errors import Conflict, NotFound
from client.sync import OvertakeClient
from contract.events import CheckpointTriggered, payload_of
from contract.models import SubtaskAck, WrittenState
from tests.client._jobs import SUBTASKS, job_spec


@pytest.fixture
def sdk(coordinator):
    with OvertakeClient(coordinator.url, retries=2) as c:
        yield c


def _target(sdk: OvertakeClient, job_id: int, cp_id: int):
    for event in sdk.event_history(job_id):
        payload = payload_of(event)
        if isinstance(payload, CheckpointTriggered) and payload.checkpoint_id == cp_id:
            return payload.target
    raise AssertionError(f"no trigger event of checkpoint {cp_id}")


def _write_and_ack(sdk: OvertakeClient, job_id: int, cp_id: int, attempt: int, tag: str) -> None:
    target = _target(sdk, job_id, cp_id)
    assert target is not None and target.prefix == f"job-{job_id}/cp-{cp_id:012d}/"
    for vertex, index in SUBTASKS:
        state = f"{tag} {vertex}[{index}]".encode()
        key = f"{target.prefix}{vertex}-{index}-a{attempt}.state"
        path = Path(unquote(urlparse(target.url + key).path))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(state)
        written = WrittenState(
            key=key, size=len(state), operator_size=len(state), operator_sha256=hashlib.sha256(state).hexdigest()
        )
        ack = SubtaskAck(attempt=attempt, vertex=vertex, subtask_index=index, written=written)
        assert sdk.ack(job_id, cp_id, ack).num_acknowledged_subtasks >= 1


def test_a_subtask_writes_its_state_acks_the_handle_and_reports_a_corrupt_blob(sdk):
    job = sdk.create_job(job_spec(retained=3))
    sdk.start_attempt(job.id)
    first = sdk.trigger_checkpoint(job.id)
    _write_and_ack(sdk, job.id, first.id, 1, "first")
    second = sdk.trigger_checkpoint(job.id)
    _write_and_ack(sdk, job.id, second.id, 1, "second")
    assert sdk.get_checkpoint(job.id, second.id).status.value == "COMPLETED"

    attempt = sdk.start_attempt(job.id)
    plan = attempt.restore_plan
    assert plan.checkpoint_id == second.id
    sub = next(s for s in plan.subtasks if (s.vertex, s.subtask_index) == ("sink", 0))
    (location,) = sub.blobs
    with open(unquote(urlparse(location.url).path), "rb") as f:
        f.seek(location.offset)
        assert f.read(location.size) == b"second sink[0]"

    info = sdk.report_corrupt_blob(
        job.id, location.blob_id, attempt=attempt.attempt, vertex="sink", subtask_index=0, reason="sha256 mismatch"
    )
    assert info.corrupt and "sink[0]" in info.corrupt
    again = sdk.report_corrupt_blob(
        job.id, location.blob_id, attempt=attempt.attempt, vertex="sink", subtask_index=0, reason="retried"
    )
    assert again.corrupt == info.corrupt
    with pytest.raises(Conflict):
        sdk.report_corrupt_blob(job.id, location.blob_id, attempt=1, vertex="sink", subtask_index=0, reason="old")
    with pytest.raises(NotFound):
        sdk.report_corrupt_blob(job.id, "0" * 32, attempt=attempt.attempt, vertex="sink", subtask_index=0, reason="?")

    fallback = sdk.restore_plan(job.id)
    assert fallback.checkpoint_id == first.id
    assert fallback.fallbacks[0].checkpoint_id == second.id and location.blob_id in fallback.fallbacks[0].reason
