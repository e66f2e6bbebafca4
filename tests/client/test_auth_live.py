"""Tokens against a coordinator with an admin token: who may call what, and the errors a client sees."""

from __future__ import annotations

import json

import httpx
import pytest

from client.errors import Forbidden, Unauthorized
from client.sync import OvertakeClient
from contract.models import SubtaskAck
from tests.client._jobs import job_spec


@pytest.fixture
def admin(secured_coordinator):
    with OvertakeClient(secured_coordinator.url, token=secured_coordinator.admin_token) as c:
        yield c


def test_without_a_token_management_routes_are_unauthorized(secured_coordinator):
    with OvertakeClient(secured_coordinator.url, token="") as anonymous:
        with pytest.raises(Unauthorized) as info:
            anonymous.list_jobs()
    assert info.value.status_code == 401


def test_a_task_token_works_for_its_own_job_only(admin):
    mine = admin.create_job(job_spec())
    other = admin.create_job(job_spec())
    attempt = admin.start_attempt(mine.id)
    admin.start_attempt(other.id)
    cp = admin.trigger_checkpoint(mine.id)
    with admin.with_token(attempt.task_token) as task:
        result = task.ack(mine.id, cp.id, SubtaskAck(attempt=attempt.attempt, vertex="src", subtask_index=0))
        assert result.num_acknowledged_subtasks == 1
        assert task.get_job(mine.id).id == mine.id
        with pytest.raises(Forbidden) as info:
            task.get_job(other.id)
        assert info.value.status_code == 403


def test_a_task_token_cannot_manage_jobs(admin):
    job = admin.create_job(job_spec())
    attempt = admin.start_attempt(job.id)
    with admin.with_token(attempt.task_token) as task, pytest.raises((Forbidden, Unauthorized)):
        task.cancel_job(job.id)


def _stream_events(url: str, job_id: int, token: str, while_open, until: tuple | None = None) -> list[tuple]:
    """(type, attempt) of the events a stream opened with `token` delivers, after `while_open()` ran with it open:
    until the coordinator ends it, or through the event `until`."""
    seen = []
    with httpx.Client(base_url=url, timeout=httpx.Timeout(30.0)) as http:
        auth = {"Authorization": f"Bearer {token}"}
        with http.stream("GET", f"/api/v1/jobs/{job_id}/events", headers=auth) as stream:
            assert stream.status_code == 200
            while_open()
            for line in stream.iter_lines():
                if line.startswith("data:"):
                    event = json.loads(line[len("data:") :])
                    seen.append((event["type"], event["data"].get("attempt")))
                    if seen[-1] == until:
                        break
    return seen


def test_a_task_tokens_event_stream_ends_when_a_later_attempt_starts(admin, secured_coordinator):
    """The token of attempt 1 stops working when attempt 2 starts; a stream it opened before must not go on to hand
    its holder attempt 2's events, whose checkpoint triggers carry write targets into the blob store."""
    job = admin.create_job(job_spec())
    first = admin.start_attempt(job.id)

    def next_attempt_triggers():
        admin.start_attempt(job.id)
        admin.trigger_checkpoint(job.id)

    seen = _stream_events(
        secured_coordinator.url, job.id, first.task_token, next_attempt_triggers, until=("checkpoint.triggered", 2)
    )
    assert seen == [("attempt.started", 1), ("attempt.started", 2)]  # the stream ended there
    # a later attempt's token reads the older attempts' starts and goes on to its own events
    third = admin.start_attempt(job.id)
    seen = _stream_events(
        secured_coordinator.url, job.id, third.task_token, lambda: admin.trigger_checkpoint(job.id),
        until=("checkpoint.triggered", 3),
    )
    assert seen == [("attempt.started", 1), ("attempt.started", 2), ("checkpoint.triggered", 2),
                    ("checkpoint.aborted", 2), ("attempt.started", 3), ("checkpoint.triggered", 3)]
