"""The client across a coordinator that goes away and comes back (its own coordinator per test)."""

from __future__ import annotations

import threading

import pytest

from client.errors import CoordinatorUnreachable, OutcomeUnknown
from client.sync import OvertakeClient
from contract.models import CheckpointStatus, EventType
from tests.client._jobs import SUBTASKS, job_spec, upload_and_ack


def test_a_followed_stream_resumes_across_a_coordinator_restart_without_loss_or_repeats(fresh_coordinator):
    fresh_coordinator.start()
    with OvertakeClient(fresh_coordinator.url, retries=12, backoff=0.1) as c:
        job = c.create_job(job_spec())
        attempt = c.start_attempt(job.id)
        last = c.event_history(job.id)[-1].id
        stream = c.events(job.id, after=last)
        cp = c.trigger_checkpoint(job.id)
        triggered = next(stream)
        assert (triggered.id, triggered.type) == (last + 1, EventType.checkpoint_triggered)

        fresh_coordinator.restart()
        results = [upload_and_ack(c, attempt, cp, v, i) for v, i in SUBTASKS]
        assert results[-1].status is CheckpointStatus.completed

        resumed = next(stream)
        stream.close()
        history = c.event_history(job.id, after=triggered.id)
        assert resumed == history[0]
        assert resumed.id == triggered.id + 1


def test_a_read_waits_out_a_restart_through_its_retries(fresh_coordinator):
    fresh_coordinator.start()
    with OvertakeClient(fresh_coordinator.url, retries=12, backoff=0.1) as c:
        job = c.create_job(job_spec())
        fresh_coordinator.stop()
        starter = threading.Thread(target=fresh_coordinator.start)
        starter.start()
        try:
            assert c.get_job(job.id).name == job.name
        finally:
            starter.join()


def test_a_stopped_coordinator_is_unreachable_and_the_message_names_its_url(fresh_coordinator):
    fresh_coordinator.start()
    url = fresh_coordinator.url
    fresh_coordinator.stop()
    with OvertakeClient(url, retries=1, backoff=0.01) as c:
        with pytest.raises(CoordinatorUnreachable) as info:
            c.trigger_checkpoint(1)
    assert not isinstance(info.value, OutcomeUnknown)  # refused before sending: known not applied
    assert url in str(info.value)
