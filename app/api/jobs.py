"""Routes for jobs and attempts."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from app.api.deps import ADMIN, TASK, CtxDep, JobId, Offset, TokenAttempt
from app.domain import jobs, views
from app.domain.context import get_job_or_404
from contract.models import (
    MAX_ATTEMPT,
    Attempt,
    AttemptCreate,
    AttemptPage,
    Job,
    JobCreate,
    JobFinish,
    JobPage,
    JobStatus,
    RunningReport,
    RunningState,
)
from contract.models.base import rules_extra

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])


@router.post("", status_code=201, dependencies=ADMIN, response_model=Job, openapi_extra=rules_extra(*JobCreate.RULES))
async def create_job(body: JobCreate, ctx: CtxDep) -> Job:
    """Register a job: its graph and checkpoint config. Invalid ones are refused with 422 naming the problem."""
    async with ctx.tx() as s:
        job = await jobs.create_job(s, body)
        return await views.job_view(s, job)


@router.get("", dependencies=ADMIN, response_model=JobPage)
async def list_jobs(
    ctx: CtxDep,
    status: JobStatus | None = None,
    name: Annotated[str | None, Query(max_length=128)] = None,
    label: Annotated[str | None, Query(pattern=r"^[^=]+=.*$", max_length=1200, description="key=value")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Offset = 0,
) -> JobPage:
    """Jobs, newest first, filtered by status, name or a label (`key=value`)."""
    async with ctx.tx(readonly=True) as s:
        return await views.list_jobs(s, status, name, limit, offset, label)


@router.get("/{job_id}", dependencies=TASK, response_model=Job)
async def get_job(job_id: JobId, ctx: CtxDep) -> Job:
    async with ctx.tx(readonly=True) as s:
        return await views.job_view(s, await get_job_or_404(s, job_id))


@router.post("/{job_id}/cancel", dependencies=ADMIN, response_model=Job)
async def cancel_job(job_id: JobId, ctx: CtxDep) -> Job:
    """Cancel a job: its pending checkpoints are aborted and its subtasks stop on the job.status event."""
    async with ctx.tx() as s:
        job = await jobs.cancel_job(s, job_id)
        return await views.job_view(s, job)


@router.post("/{job_id}/finish", response_model=Job)
async def finish_job(job_id: JobId, body: JobFinish, ctx: CtxDep, token_attempt: TokenAttempt) -> Job:
    """Mark a job FINISHED or FAILED (with a message), as its runtime reports."""
    async with ctx.tx() as s:
        job = await jobs.finish_job(s, job_id, body, token_attempt)
        return await views.job_view(s, job)


@router.post(
    "/{job_id}/attempts",
    status_code=201,
    dependencies=ADMIN,
    response_model=Attempt,
    openapi_extra=rules_extra(*AttemptCreate.RULES),
)
async def start_attempt(job_id: JobId, ctx: CtxDep, body: AttemptCreate | None = None) -> Attempt:
    """Start the next attempt: returns its number, a job-scoped task token (shown once) and the restore plan.

    With `parallelism`, the job is rescaled: keyed state is split by key group, channel state redistributed."""
    body = body or AttemptCreate()
    async with ctx.tx() as s:
        return await jobs.start_attempt(
            ctx, s, job_id, body.restore_from, body.parallelism, body.wait_for_running, body.reason
        )


@router.get("/{job_id}/attempts", dependencies=TASK, response_model=AttemptPage)
async def list_attempts(
    job_id: JobId,
    ctx: CtxDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Offset = 0,
) -> AttemptPage:
    """A job's attempts, newest first: the checkpoint each restored, the ones its restore passed over and why, the
    vertices it rescaled, and the current attempt's recovery phases (from the live metrics this replica holds)."""
    async with ctx.tx(readonly=True) as s:
        return await views.list_attempts(s, job_id, limit, offset, ctx.live)


@router.post("/{job_id}/attempts/{attempt}/running", dependencies=TASK, response_model=RunningState)
async def report_running(
    job_id: JobId, attempt: Annotated[int, Path(ge=1, le=MAX_ATTEMPT)], body: RunningReport, ctx: CtxDep
) -> RunningState:
    """A subtask of the attempt runs (idempotent). When every subtask reported, the attempt's periodic checkpoints
    count their interval from then (with `wait_for_running`), so no checkpoint's timeout is spent on start-up."""
    async with ctx.tx() as s:
        return await jobs.report_running(s, job_id, attempt, body)
