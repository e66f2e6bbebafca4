"""The SDK against the real coordinator (the `coordinator` fixture: uvicorn on SQLite, no auth)."""

from __future__ import annotations

import hashlib
import itertools
import time

import pytest

from client.errors import Conflict, InvalidRequest, NotFound, RangeNotSatisfiable
from client.sync import OvertakeClient
from contract.models import (
    AckMetrics,
    BlobRef,
    ChannelSegment,
    CheckpointStatus,
    CheckpointType,
    Decline,
    EventType,
    JobStatus,
    SubtaskAck,
)
from tests.client._jobs import SUBTASKS, complete_checkpoint, job_spec, state_of, upload_and_ack


@pytest.fixture
def sdk(coordinator):
    with OvertakeClient(coordinator.url, retries=2) as c:
        yield c


@pytest.fixture
def running(sdk):
    """A registered job with its first attempt started."""
    job = sdk.create_job(job_spec())
    return job, sdk.start_attempt(job.id)


def test_health_answers(sdk):
    assert sdk.health()["status"] in ("ok", "healthy", "pass")


def test_a_created_job_reads_back_as_registered(sdk):
    spec = job_spec()
    job = sdk.create_job(spec)
    assert job.name == spec["name"]
    assert job.status is JobStatus.created
    assert [v.id for v in job.graph.vertices] == ["src", "sink"]
    assert job.labels == {"suite": "client"}
    assert sdk.get_job(job.id) == job
    newest = sdk.list_jobs(limit=1)
    assert newest.items[0].id == job.id
    assert newest.total >= 1


def test_an_edge_to_an_unknown_vertex_is_refused_naming_it(sdk):
    spec = job_spec()
    spec["graph"]["edges"].append({"source": "src", "target": "nowhere"})
    with pytest.raises(InvalidRequest) as info:
        sdk.create_job(spec)
    assert info.value.status_code == 422
    assert "nowhere" in str(info.value)


def test_an_unknown_job_is_not_found(sdk):
    with pytest.raises(NotFound) as info:
        sdk.get_job(987_654_321)
    assert info.value.code == "not_found"
    assert "987654321" in str(info.value)


def test_the_first_attempt_starts_fresh_with_a_task_token(sdk, running):
    job, attempt = running
    assert attempt.attempt == 1
    assert attempt.task_token
    assert attempt.restore_plan.checkpoint_id is None
    assert sdk.get_job(job.id).current_attempt == 1


def test_a_checkpoint_completes_when_every_subtask_acked(sdk, running):
    job, attempt = running
    cp = sdk.trigger_checkpoint(job.id, policy="unaligned")
    assert cp.status is CheckpointStatus.pending
    assert (cp.num_subtasks, cp.num_acknowledged_subtasks, cp.policy.value) == (3, 0, "unaligned")
    results = [upload_and_ack(sdk, attempt, cp, v, i) for v, i in SUBTASKS]
    assert [r.num_acknowledged_subtasks for r in results] == [1, 2, 3]
    assert results[-1].status is CheckpointStatus.completed
    detail = sdk.get_checkpoint(job.id, cp.id)
    assert detail.status is CheckpointStatus.completed
    assert sorted((s.vertex, s.subtask_index) for s in detail.subtasks) == sorted(SUBTASKS)
    assert detail.pending_subtasks == []
    assert detail.state_size == sum(len(state_of(cp.id, v, i)) for v, i in SUBTASKS)
    assert detail.processed_data == 3 * 4096
    assert sdk.get_job(job.id).latest_completed_checkpoint_id == cp.id


def test_a_repeated_ack_is_a_duplicate_and_a_different_one_conflicts(sdk, running):
    job, attempt = running
    cp = sdk.trigger_checkpoint(job.id)
    first = upload_and_ack(sdk, attempt, cp, "src", 0)
    again = upload_and_ack(sdk, attempt, cp, "src", 0)
    assert (first.duplicate, again.duplicate) == (False, True)
    assert again.num_acknowledged_subtasks == 1
    # state uploaded after the subtask's ack could never be named by it: refused before anything is stored
    with pytest.raises(Conflict) as late:
        sdk.upload_blob(
            job.id, cp.id, attempt=attempt.attempt, vertex="src", subtask_index=0, kind="channel", data=b"in-flight"
        )
    assert "already sent an ack" in str(late.value)
    other = SubtaskAck(attempt=attempt.attempt, vertex="src", subtask_index=0, metrics=AckMetrics(sync_duration=99))
    with pytest.raises(Conflict) as conflict:
        sdk.ack(job.id, cp.id, other)
    assert conflict.value.status_code == 409
    assert "src" in str(conflict.value)


def test_uploading_the_same_blob_again_changes_nothing_and_other_content_conflicts(sdk, running, tmp_path):
    job, attempt = running
    cp = sdk.trigger_checkpoint(job.id)
    path = tmp_path / "state.bin"
    path.write_bytes(b"\x00\x01" * 300_000)
    slot = {"attempt": attempt.attempt, "vertex": "sink", "subtask_index": 0, "kind": "operator"}
    first = sdk.upload_blob(job.id, cp.id, data=path, **slot)
    again = sdk.upload_blob(job.id, cp.id, data=path.read_bytes(), **slot)
    assert again == first
    assert first.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert first.size == 600_000
    with pytest.raises(Conflict):
        sdk.upload_blob(job.id, cp.id, data=b"something else", **slot)


def test_a_blob_downloads_whole_and_by_inclusive_range(sdk, running):
    job, attempt = running
    cp = sdk.trigger_checkpoint(job.id)
    data = bytes(range(256)) * 10
    info = sdk.upload_blob(
        job.id,
        cp.id,
        attempt=attempt.attempt,
        vertex="src",
        subtask_index=1,
        kind="channel",
        data=iter([data]),
    )
    assert sdk.download_blob(job.id, info.blob_id) == data
    assert sdk.download_blob(job.id, info.blob_id, start=10, end=19) == data[10:20]
    assert sdk.download_blob(job.id, info.blob_id, start=2550) == data[2550:]
    with pytest.raises(RangeNotSatisfiable):
        sdk.download_blob(job.id, info.blob_id, start=5000, end=5010)


def test_channel_state_of_an_ack_is_listed_by_segment(sdk, running):
    job, attempt = running
    cp = sdk.trigger_checkpoint(job.id)
    buffers = b"A" * 100 + b"B" * 50
    info = sdk.upload_blob(
        job.id, cp.id, attempt=attempt.attempt, vertex="sink", subtask_index=0, kind="channel", data=buffers
    )
    segments = [
        ChannelSegment(
            channel="in:src[0]->sink[0]",
            direction="input",
            offset=0,
            length=100,
            buffer_count=2,
            record_count=10,
        ),
        ChannelSegment(
            channel="in:src[1]->sink[0]",
            direction="input",
            offset=100,
            length=50,
            buffer_count=1,
            record_count=5,
        ),
    ]
    sdk.ack(
        job.id,
        cp.id,
        SubtaskAck(
            attempt=attempt.attempt,
            vertex="sink",
            subtask_index=0,
            channel_state=BlobRef(blob_id=info.blob_id, sha256=info.sha256, size=info.size),
            channel_segments=segments,
            metrics=AckMetrics(persisted_data=150, unaligned=True),
        ),
    )
    manifest = sdk.channel_state(job.id, cp.id)
    (entry,) = manifest.entries
    assert (entry.vertex, entry.subtask_index, entry.blob_id) == ("sink", 0, info.blob_id)
    assert [(s.channel, s.offset, s.length) for s in entry.segments] == [
        ("in:src[0]->sink[0]", 0, 100),
        ("in:src[1]->sink[0]", 100, 50),
    ]


def test_a_batch_of_acks_answers_per_item(sdk, running):
    job, attempt = running
    cp = sdk.trigger_checkpoint(job.id)
    acks = [SubtaskAck(attempt=attempt.attempt, vertex=v, subtask_index=i) for v, i in SUBTASKS[:2]]
    acks.append(SubtaskAck(attempt=attempt.attempt, vertex="nope", subtask_index=0))
    result = sdk.ack_batch(job.id, cp.id, acks)
    assert [(item.vertex, item.ok) for item in result.items] == [
        ("src", True),
        ("src", True),
        ("nope", False),
    ]
    assert result.items[1].result.num_acknowledged_subtasks == 2
    assert result.items[2].status_code >= 400 and "nope" in result.items[2].error


def test_a_decline_aborts_the_checkpoint_and_later_acks_conflict_saying_why(sdk, running):
    job, attempt = running
    cp = sdk.trigger_checkpoint(job.id)
    aborted = sdk.decline(
        job.id,
        cp.id,
        Decline(attempt=attempt.attempt, vertex="sink", subtask_index=0, reason="disk full on worker 3"),
    )
    assert aborted.status is CheckpointStatus.aborted
    assert "disk full on worker 3" in aborted.failure_reason
    with pytest.raises(Conflict) as info:
        sdk.ack(job.id, cp.id, SubtaskAck(attempt=attempt.attempt, vertex="src", subtask_index=0))
    assert "abort" in str(info.value).lower()


def test_the_restore_plan_points_at_the_latest_completed_checkpoint(sdk):
    job = sdk.create_job(job_spec(retained=2))
    attempt = sdk.start_attempt(job.id)
    first = complete_checkpoint(sdk, attempt)
    second = complete_checkpoint(sdk, attempt)
    plan = sdk.restore_plan(job.id)
    assert plan.checkpoint_id == second.id
    assert plan.fallbacks == []
    by_subtask = {(s.vertex, s.subtask_index): s for s in plan.subtasks}
    assert sorted(by_subtask) == sorted(SUBTASKS)
    src1 = by_subtask[("src", 1)]
    assert src1.source_offsets == {"partition-0": 10 * (second.id + 1)}
    (state,) = src1.operator_state
    assert sdk.download_blob(job.id, state.blob_id) == state_of(second.id, "src", 1)
    older = sdk.restore_plan(job.id, checkpoint_id=first.id)
    assert older.checkpoint_id == first.id


def test_a_checkpoint_collected_under_retention_cannot_be_restored(sdk, running):
    job, attempt = running  # retained=1
    first = complete_checkpoint(sdk, attempt)
    complete_checkpoint(sdk, attempt)
    with pytest.raises(Conflict) as info:
        _wait_collected(sdk, job.id, first.id)
        sdk.restore_plan(job.id, checkpoint_id=first.id)
    assert "retention" in str(info.value)


def _wait_collected(sdk, job_id, checkpoint_id):
    """Retention may collect in the background: wait (bounded) until the checkpoint says it was discarded."""
    for _ in range(200):
        if sdk.get_checkpoint(job_id, checkpoint_id).discarded:
            return
        time.sleep(0.05)


def test_a_new_attempt_restores_the_latest_checkpoint(sdk, running):
    job, attempt = running
    cp = complete_checkpoint(sdk, attempt)
    second = sdk.start_attempt(job.id)
    assert second.attempt == 2
    assert second.restore_plan.checkpoint_id == cp.id
    assert second.task_token != attempt.task_token


def test_checkpoint_history_and_statistics(sdk, running):
    job, attempt = running
    done = complete_checkpoint(sdk, attempt)
    pending = sdk.trigger_checkpoint(job.id)
    page = sdk.list_checkpoints(job.id)
    assert [c.id for c in page.items] == [pending.id, done.id]
    completed = sdk.list_checkpoints(job.id, status="COMPLETED")
    assert [c.id for c in completed.items] == [done.id]
    stats = sdk.checkpoint_stats(job.id)
    assert (stats.counts.completed, stats.counts.in_progress) == (1, 1)
    assert stats.latest.completed.id == done.id


def test_a_savepoint_is_aligned_and_marked_as_savepoint(sdk, running):
    job, _ = running
    sp = sdk.trigger_savepoint(job.id)
    assert sp.is_savepoint
    assert sp.checkpoint_type is CheckpointType.savepoint
    assert sp.policy.value == "aligned"


def test_a_second_trigger_past_max_concurrent_conflicts_with_the_reason(sdk, running):
    job, _ = running
    sdk.trigger_checkpoint(job.id)
    with pytest.raises(Conflict) as info:
        sdk.trigger_checkpoint(job.id)
    assert "concurrent" in str(info.value)


def test_cancel_aborts_pending_checkpoints(sdk, running):
    job, _ = running
    cp = sdk.trigger_checkpoint(job.id)
    cancelled = sdk.cancel_job(job.id)
    assert cancelled.status is JobStatus.cancelled
    assert sdk.get_checkpoint(job.id, cp.id).status is CheckpointStatus.aborted


def test_finish_with_failure_keeps_the_message(sdk, running):
    job, attempt = running
    finished = sdk.finish_job(job.id, "FAILED", message="source topic deleted", attempt=attempt.attempt)
    assert finished.status is JobStatus.failed
    assert finished.status_message == "source topic deleted"


def test_events_replay_from_history_and_resume_after_an_id(sdk, running):
    job, attempt = running
    cp = complete_checkpoint(sdk, attempt)
    history = sdk.event_history(job.id)
    types = [e.type for e in history]
    assert EventType.attempt_started in types
    assert EventType.checkpoint_triggered in types and EventType.checkpoint_completed in types
    assert [e.id for e in history] == sorted(e.id for e in history)
    triggered = next(e for e in history if e.type is EventType.checkpoint_triggered)
    assert triggered.data["checkpoint_id"] == cp.id
    assert sdk.event_history(job.id, after=triggered.id) == [e for e in history if e.id > triggered.id]
    streamed = list(itertools.islice(sdk.events(job.id, after=history[0].id), len(history) - 1))
    assert streamed == history[1:]


def test_the_stream_delivers_events_that_happen_while_following(sdk, running):
    job, attempt = running
    last = sdk.event_history(job.id)[-1].id
    stream = sdk.events(job.id, after=last)
    cp = sdk.trigger_checkpoint(job.id)
    event = next(stream)
    stream.close()
    assert (event.id, event.type, event.data["checkpoint_id"]) == (
        last + 1,
        EventType.checkpoint_triggered,
        cp.id,
    )


def test_start_attempt_translates_restore_from_and_running_reports_are_idempotent(coordinator):
    with OvertakeClient(coordinator.url, retries=2) as c:
        job = c.create_job({"name": "running", "graph": {"vertices": [{"id": "a", "parallelism": 2}]}})
        fresh = c.start_attempt(job.id, restore_from=None, wait_for_running=True)
        assert fresh.restore_plan.checkpoint_id is None and not fresh.restore_plan.requested_latest
        latest = c.start_attempt(job.id)
        assert latest.restore_plan.requested_latest and latest.attempt == 2
        assert c.report_running(job.id, 2, "a", 0).running_subtasks == 1
        assert c.report_running(job.id, 2, "a", 0).running_subtasks == 1
        state = c.report_running(job.id, 2, "a", 1)
        assert state.running_subtasks == 2 and state.all_running_at is not None
        with pytest.raises(InvalidRequest):
            c.start_attempt(job.id, restore_from="newest")
