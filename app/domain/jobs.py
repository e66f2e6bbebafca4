"""Jobs and attempts: registering, starting attempts (with their task token and restore plan), cancelling, finishing."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AttemptRow, JobRow
from app.domain import lifecycle
from app.domain.checkpoints import abort_pending
from app.domain.context import Context, get_job_or_404, now_ms
from app.domain.graph import validate_config, validate_graph
from app.domain.lifecycle import AbortReason
from app.domain.restore import build_plan, select_checkpoint
from app.errors import Conflict, Invalid
from app.events import emit
from client.models import Attempt, EventType, Graph, JobCreate, JobFinish, JobStatus, RestorePlan


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def create_job(s: AsyncSession, body: JobCreate) -> JobRow:
    validate_graph(body.graph)
    validate_config(body.checkpoint)
    now = now_ms()
    job = JobRow(
        name=body.name,
        kind=body.kind,
        status=JobStatus.created.value,
        graph=body.graph.model_dump(mode="json"),
        config=body.checkpoint.model_dump(mode="json"),
        labels=body.labels,
        num_subtasks=sum(v.parallelism for v in body.graph.vertices),
        current_attempt=None,
        next_checkpoint_id=1,
        event_seq=0,
        consecutive_failures=0,
        created_at=now,
        updated_at=now,
    )
    s.add(job)
    await s.flush()
    return job


async def cancel_job(s: AsyncSession, job_id: int) -> JobRow:
    job = await get_job_or_404(s, job_id, lock=True)
    now = now_ms()
    lifecycle.move_job(job, JobStatus.cancelled, "cancelled by request")
    await abort_pending(s, job, AbortReason.job_cancelled, "the job was cancelled", now)
    await _end_attempt(s, job, now)
    job.updated_at = now
    emit(s, job, EventType.job_status, {"status": job.status, "message": job.status_message}, now)
    return job


async def finish_job(s: AsyncSession, job_id: int, body: JobFinish) -> JobRow:
    job = await get_job_or_404(s, job_id, lock=True)
    if body.attempt is not None and body.attempt != job.current_attempt:
        raise Conflict(
            f"job {job_id} is on attempt {job.current_attempt}; attempt {body.attempt} can no longer finish it"
        )
    now = now_ms()
    lifecycle.move_job(job, JobStatus(body.status), body.message)
    await abort_pending(s, job, AbortReason.job_ended, f"the job ended as {body.status}", now)
    await _end_attempt(s, job, now)
    job.updated_at = now
    emit(s, job, EventType.job_status, {"status": job.status, "message": job.status_message}, now)
    return job


async def _end_attempt(s: AsyncSession, job: JobRow, now: int) -> None:
    if job.current_attempt is not None:
        await s.execute(
            update(AttemptRow)
            .where(
                AttemptRow.job_id == job.id,
                AttemptRow.number == job.current_attempt,
                AttemptRow.ended_at.is_(None),
            )
            .values(ended_at=now)
        )


def rescale(job: JobRow, parallelism: dict[str, int]) -> None:
    """Change vertices' parallelism for the next attempt; the graph must stay valid (forward edges, key groups)."""
    graph = Graph.model_validate(job.graph)
    known = {v.id: v for v in graph.vertices}
    for vertex, p in parallelism.items():
        if vertex not in known:
            raise Invalid(f"cannot rescale unknown vertex {vertex!r}; the job's vertices are {', '.join(known)}")
        if not 1 <= p <= known[vertex].max_parallelism:
            raise Invalid(
                f"vertex {vertex!r} can run with parallelism 1 to {known[vertex].max_parallelism} "
                f"(its max_parallelism), not {p}"
            )
        known[vertex].parallelism = p
    validate_graph(graph)
    job.graph = graph.model_dump(mode="json")
    job.num_subtasks = sum(v.parallelism for v in graph.vertices)


async def start_attempt(
    ctx: Context, s: AsyncSession, job_id: int, restore_from, parallelism: dict[str, int] | None = None
) -> Attempt:
    """Open the next attempt: abort the older attempt's pending checkpoints, issue a task token, plan the restore."""
    job = await get_job_or_404(s, job_id, lock=True)
    now = now_ms()
    lifecycle.move_job(job, JobStatus.running, None)
    if parallelism:
        rescale(job, parallelism)
    candidates = await select_checkpoint(s, job, restore_from)
    plan: RestorePlan = await build_plan(ctx, s, job, candidates, restore_from)
    if job.current_attempt is not None:
        await abort_pending(
            s, job, AbortReason.new_attempt, f"attempt {job.current_attempt + 1} started", now
        )
        await _end_attempt(s, job, now)
    number = (job.current_attempt or 0) + 1
    token = "ovt_" + secrets.token_urlsafe(32)
    s.add(
        AttemptRow(
            job_id=job.id,
            number=number,
            token_hash=hash_token(token),
            restored_checkpoint_id=plan.checkpoint_id,
            started_at=now,
        )
    )
    job.current_attempt = number
    job.consecutive_failures = 0
    job.last_trigger_at = now  # the first periodic checkpoint comes one interval after the start
    job.updated_at = now
    emit(
        s,
        job,
        EventType.attempt_started,
        {
            "attempt": number,
            "restored_checkpoint_id": plan.checkpoint_id,
            "fallbacks": [f.model_dump() for f in plan.fallbacks],
        },
        now,
    )
    return Attempt(job_id=job.id, attempt=number, task_token=token, started_at=now, restore_plan=plan)


async def job_for_token(s: AsyncSession, token: str) -> int | None:
    row = (
        await s.execute(select(AttemptRow.job_id).where(AttemptRow.token_hash == hash_token(token)))
    ).scalar_one_or_none()
    return row
