"""Jobs and attempts: registering, starting attempts (with their task token and restore plan), cancelling, finishing."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AttemptRow, JobRow, RunningSubtaskRow
from app.domain import lifecycle
from app.domain.checkpoints import check_subtask
from app.domain.context import Context, get_job_or_404, now_ms
from app.domain.graph import validate_config, validate_graph
from app.domain.lifecycle import AbortReason
from app.domain.restore import build_plan, left_off, select_checkpoint
from app.errors import Conflict, Invalid, Unauthorized
from app.events import emit
from contract.events import AttemptStarted
from contract.models import (
    AfterAttempt,
    Attempt,
    Graph,
    JobCreate,
    JobFinish,
    JobStatus,
    RestorePlan,
    RunningReport,
    RunningState,
)


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
    await lifecycle.end_job(
        s, job, JobStatus.cancelled, "cancelled by request", AbortReason.job_cancelled, "the job was cancelled", now_ms()
    )
    return job


async def lock_job_as(s: AsyncSession, job_id: int, token_attempt: int | None) -> JobRow:
    """Load a job holding its row lock, for a request that came with the task token of `token_attempt` (None: the
    admin token, or no auth), checked again under the lock: the request's auth check ran before its transaction,
    and a new attempt may have started meanwhile. A task of the old attempt still running (a zombie on a lost
    executor) must not trigger, stop or finish the new one."""
    job = await get_job_or_404(s, job_id, lock=True)
    if token_attempt is not None:
        refusal = token_refusal(job_id, token_attempt, job.current_attempt, job.status)
        if refusal is not None:
            raise Unauthorized(refusal)
    return job


async def finish_job(s: AsyncSession, job_id: int, body: JobFinish, token_attempt: int | None = None) -> JobRow:
    job = await lock_job_as(s, job_id, token_attempt)
    lifecycle.check_current_attempt(job, body.attempt, "this request to finish it")
    await lifecycle.end_job(
        s, job, JobStatus(body.status), body.message, AbortReason.job_ended, f"the job ended as {body.status}", now_ms()
    )
    return job


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
    ctx: Context,
    s: AsyncSession,
    job_id: int,
    restore_from,
    parallelism: dict[str, int] | None = None,
    wait_for_running: bool = False,
    reason: str | None = None,
) -> Attempt:
    """Open the next attempt: abort the older attempt's pending checkpoints, issue a task token, plan the restore."""
    job = await get_job_or_404(s, job_id, lock=True)
    now = now_ms()
    lifecycle.move_job(job, JobStatus.running, reason)
    if parallelism:
        rescale(job, parallelism)
    if isinstance(restore_from, AfterAttempt):
        # chosen here, under the job's lock and before the old attempt's pending checkpoints are aborted: nothing
        # of it can complete meanwhile, so retention cannot collect the choice (the plan's requested_checkpoint)
        restore_from = await left_off(s, job, restore_from)
    candidates = await select_checkpoint(s, job, restore_from)
    plan: RestorePlan = await build_plan(ctx, s, job, candidates, restore_from)
    if job.current_attempt is not None:
        await lifecycle.abort_pending(
            s, job, AbortReason.new_attempt, f"attempt {job.current_attempt + 1} started", now
        )
        await lifecycle.end_attempt(s, job, now)
    number = (job.current_attempt or 0) + 1
    token = "ovt_" + secrets.token_urlsafe(32)
    s.add(
        AttemptRow(
            job_id=job.id,
            number=number,
            token_hash=hash_token(token),
            restored_checkpoint_id=plan.checkpoint_id,
            reason=reason,
            started_at=now,
        )
    )
    job.current_attempt = number
    job.consecutive_failures = 0
    job.last_trigger_at = now  # the first periodic checkpoint comes one interval after the start ...
    job.running_at = None
    # ... or, when the attempt waits for its subtasks, one interval after the last reported running (at the
    # latest once the grace period is over: a runtime that never reports still gets its checkpoints)
    job.periodic_from = now + int(ctx.settings.running_grace * 1000) if wait_for_running else None
    job.updated_at = now
    emit(
        s,
        job,
        AttemptStarted(
            attempt=number,
            restored_checkpoint_id=plan.checkpoint_id,
            fallbacks=plan.fallbacks,
            rescaled=plan.rescaled,
            reason=reason,
        ),
        now,
    )
    return Attempt(job_id=job.id, attempt=number, task_token=token, started_at=now, restore_plan=plan)


async def attempt_for_token(s: AsyncSession, token: str) -> tuple[int, int] | None:
    """(job id, attempt number) whose task token this is, or None."""
    row = (
        await s.execute(
            select(AttemptRow.job_id, AttemptRow.number).where(AttemptRow.token_hash == hash_token(token))
        )
    ).one_or_none()
    return (row[0], row[1]) if row is not None else None


def token_refusal(job_id: int, attempt: int, current_attempt: int | None, status: str) -> str | None:
    """Why the task token of `attempt` no longer works for its job, or None: a token works while its attempt is
    the job's current one and the job has not ended."""
    if current_attempt != attempt:
        return (
            f"this task token belongs to attempt {attempt} of job {job_id}, which ended; the job is on attempt "
            f"{current_attempt}: use that attempt's token"
        )
    if status not in lifecycle.ACTIVE:
        return f"this task token belongs to attempt {attempt} of job {job_id}, which ended: the job is {status}"
    return None


async def check_token_attempt(s: AsyncSession, job_id: int, attempt: int) -> str | None:
    row = (await s.execute(select(JobRow.current_attempt, JobRow.status).where(JobRow.id == job_id))).one_or_none()
    if row is None:
        return f"job {job_id} does not exist"
    return token_refusal(job_id, attempt, row[0], row[1])


async def report_running(s: AsyncSession, job_id: int, attempt: int, body: RunningReport) -> RunningState:
    """A subtask of the current attempt runs. Idempotent. When the last one reports, the attempt's periodic
    checkpoints start counting their interval from now."""
    job = await get_job_or_404(s, job_id, lock=True)
    lifecycle.check_current_attempt(job, attempt, "this running report")
    if job.status not in lifecycle.ACTIVE:
        raise Conflict(f"job {job_id} is {job.status}; its subtasks can no longer report running")
    check_subtask(job, body.vertex, body.subtask_index)
    now = now_ms()
    key = (job_id, attempt, body.vertex, body.subtask_index)
    if await s.get(RunningSubtaskRow, key) is None:
        s.add(RunningSubtaskRow(job_id=job_id, attempt=attempt, vertex=body.vertex,
                                subtask_index=body.subtask_index, reported_at=now))
        await s.flush()
    running = (
        await s.execute(
            select(func.count()).select_from(RunningSubtaskRow).where(
                RunningSubtaskRow.job_id == job_id, RunningSubtaskRow.attempt == attempt
            )
        )
    ).scalar_one()
    if running >= job.num_subtasks and job.running_at is None:
        job.running_at = now
        if job.periodic_from is not None:
            job.periodic_from = now
            job.last_trigger_at = now
    return RunningState(
        job_id=job_id, attempt=attempt, running_subtasks=running, num_subtasks=job.num_subtasks,
        all_running_at=job.running_at,
    )
