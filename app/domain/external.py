"""Checkpoints an engine took on its own and reports complete (Structured Streaming micro-batches)."""

from __future__ import annotations

import hashlib

from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AckRow, CheckpointRow, JobRow
from app.domain.checkpoints import ACTIVE
from app.domain.completion import complete_checkpoint
from app.domain.lifecycle import PENDING, check_current_attempt
from app.errors import Conflict
from app.events import emit
from contract.events import CheckpointTriggered
from contract.models import BarrierPolicy, ExternalCheckpoint


def _digest(body: ExternalCheckpoint) -> str:
    return hashlib.sha256(body.model_dump_json(exclude={"attempt"}).encode()).hexdigest()


async def record_external(s: AsyncSession, job: JobRow, body: ExternalCheckpoint) -> tuple[CheckpointRow, bool]:
    """Record a completed aligned checkpoint with the engine's id. Returns (checkpoint, created).

    The caller holds the job row lock. The same report again changes nothing; a different one for the same id
    is a 409; an id below the job's next id is refused (ids only grow).
    """
    if job.status not in ACTIVE or job.current_attempt is None:
        raise Conflict(f"job {job.id} is {job.status}; start an attempt before reporting checkpoints")
    check_current_attempt(job, body.attempt, "this checkpoint report")
    attempt = job.current_attempt
    digest = _digest(body)
    existing = await s.get(CheckpointRow, (job.id, body.id))
    if existing is not None:
        if (existing.details or {}).get("digest") == digest:
            return existing, False
        raise Conflict(f"checkpoint {body.id} of job {job.id} was already reported with different figures")
    # A job that never had a checkpoint takes the engine's first id as it is (Spark's first batch is 0).
    fresh = job.next_checkpoint_id == 1 and (
        await s.execute(select(func.count()).select_from(CheckpointRow).where(CheckpointRow.job_id == job.id))
    ).scalar_one() == 0
    if body.id < job.next_checkpoint_id and not fresh:
        raise Conflict(
            f"checkpoint ids of job {job.id} only grow: {body.id} is below the next id {job.next_checkpoint_id}"
        )
    cp = CheckpointRow(
        job_id=job.id,
        id=body.id,
        attempt=attempt,
        status=PENDING,
        is_savepoint=False,
        stop_job=False,
        policy=BarrierPolicy.aligned.value,
        alignment_timeout=None,
        trigger_ts=body.trigger_timestamp,
        timeout_at=body.completed_timestamp,
        num_subtasks=job.num_subtasks,
        num_acked=job.num_subtasks,
        state_size=body.state_size,
        persisted_data=body.persisted_data,
        processed_data=body.processed_data,
        alignment_duration=body.alignment_duration,
        latest_ack_ts=body.completed_timestamp,
        any_unaligned=False,
        num_unaligned=0,
        num_over_budget=0,
        discarded=False,
        details={"digest": digest, "metrics": body.metrics, "source_offsets": body.source_offsets},
    )
    s.add(cp)
    job.next_checkpoint_id = body.id + 1
    job.last_trigger_at = body.trigger_timestamp
    offsets = body.source_offsets or {}
    rows = [
        {
            "job_id": job.id,
            "checkpoint_id": body.id,
            "vertex": v["id"],
            "subtask_index": i,
            "attempt": attempt,
            "content_hash": digest,
            "ack_ts": body.completed_timestamp,
            "sync_duration": 0,
            "async_duration": 0,
            "alignment_duration": 0,
            "start_delay": 0,
            "processed_data": 0,
            "persisted_data": 0,
            "state_size": 0,
            "unaligned": False,
            "operator_blob_id": None,
            "channel_blob_id": None,
            "segments": [],
            "source_offsets": offsets.get(v["id"]) if isinstance(offsets.get(v["id"]), dict) else None,
            "key_group_start": None,
            "key_group_end": None,
        }
        for v in job.graph["vertices"]
        for i in range(v["parallelism"])
    ]
    await s.flush()
    emit(
        s,
        job,
        CheckpointTriggered(
            checkpoint_id=cp.id,
            attempt=attempt,
            policy=cp.policy,
            trigger_timestamp=cp.trigger_ts,
            timeout_at=cp.timeout_at,
            external=True,
        ),
        body.completed_timestamp,
    )
    if rows:
        await s.execute(insert(AckRow.__table__), rows)
    await complete_checkpoint(s, job, cp, body.completed_timestamp)
    return cp, True
