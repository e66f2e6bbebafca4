"""``report_checkpoint``: the SDK side of externally reported checkpoints (Structured Streaming micro-batches),
against the real coordinator, and ``list_jobs(label=...)`` that finds a query's job again."""

from __future__ import annotations

import uuid

import pytest

from client.aio import AsyncOvertakeClient
from client.errors import Conflict, InvalidRequest
from client.sync import OvertakeClient
from contract.models import CheckpointStatus, CheckpointType, ExternalCheckpoint


@pytest.fixture
def sdk(coordinator):
    with OvertakeClient(coordinator.url, retries=2) as c:
        yield c


@pytest.fixture
def job(sdk):
    """A one-source job with its first attempt started, labelled with a query id of its own."""
    query_id = str(uuid.uuid4())
    job = sdk.create_job(
        {
            "name": "micro-batches",
            "kind": "structured_streaming",
            "graph": {"vertices": [{"id": "source-0", "parallelism": 1, "kind": "source"}]},
            "checkpoint": {"interval": None, "policy": "aligned"},
            "labels": {"spark_query_id": query_id},
        }
    )
    sdk.start_attempt(job.id)
    return job


def batch(batch_id: int, **extra) -> ExternalCheckpoint:
    t0 = 1_700_000_000_000 + batch_id * 1000
    fields = {
        "id": batch_id,
        "trigger_timestamp": t0,
        "completed_timestamp": t0 + 300,
        "state_size": 2048,
        "processed_data": 10 * batch_id,
        "source_offsets": {"source-0": {"offset": batch_id * 5}},
        "metrics": {"durationMs": {"triggerExecution": 300, "walCommit": 40, "commitOffsets": 20}},
    }
    return ExternalCheckpoint(**(fields | extra))


def test_a_reported_batch_is_a_completed_aligned_checkpoint_with_its_figures(sdk, job):
    cp = sdk.report_checkpoint(job.id, batch(0))
    assert (cp.id, cp.status, cp.checkpoint_type) == (0, CheckpointStatus.completed, CheckpointType.aligned)
    assert cp.end_to_end_duration == 300 and cp.state_size == 2048
    assert cp.details["metrics"]["durationMs"]["walCommit"] == 40
    assert sdk.restore_plan(job.id).subtasks[0].source_offsets == {"offset": 0}


def test_the_same_report_again_changes_nothing(sdk, job):
    first = sdk.report_checkpoint(job.id, batch(0))
    again = sdk.report_checkpoint(job.id, batch(0).model_dump())  # a dict is validated and sent the same
    assert again == first
    assert sdk.list_checkpoints(job.id).total == 1


def test_a_different_report_for_a_recorded_id_or_an_older_id_is_a_conflict(sdk, job):
    sdk.report_checkpoint(job.id, batch(0))
    sdk.report_checkpoint(job.id, batch(3))
    with pytest.raises(Conflict, match="different figures"):
        sdk.report_checkpoint(job.id, batch(3, state_size=1))
    with pytest.raises(Conflict, match="only grow"):
        sdk.report_checkpoint(job.id, batch(2))


def test_an_invalid_report_is_refused_before_it_is_sent(sdk, job):
    with pytest.raises(InvalidRequest, match="before trigger_timestamp"):
        sdk.report_checkpoint(job.id, {"id": 1, "trigger_timestamp": 2000, "completed_timestamp": 1000})


def test_list_jobs_finds_a_job_by_its_label(sdk, job):
    page = sdk.list_jobs(label=f"spark_query_id={job.labels['spark_query_id']}")
    assert [j.id for j in page.items] == [job.id]


async def test_the_async_client_reports_too(coordinator, sdk, job):
    async with AsyncOvertakeClient(coordinator.url, retries=2) as c:
        cp = await c.report_checkpoint(job.id, batch(4))
    assert cp.id == 4 and sdk.get_job(job.id).latest_completed_checkpoint_id == 4
