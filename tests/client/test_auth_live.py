"""Tokens against a coordinator with an admin token: who may call what, and the errors a client sees."""

from __future__ import annotations

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
