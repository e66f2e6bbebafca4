"""Routes for triggering checkpoints and savepoints and reading their history and statistics."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from app.api.deps import TASK, CheckpointId, CtxDep, JobId, Offset, TokenAttempt
from app.domain import channel_state_views, statistics, views
from app.domain.checkpoints import trigger
from app.domain.context import get_job_or_404, now_ms
from app.domain.external import record_external
from app.domain.jobs import lock_job_as
from app.domain.restore import build_plan, select_checkpoint
from contract.models import (
    MAX_ID,
    ChannelStateManifest,
    Checkpoint,
    CheckpointDetail,
    CheckpointPage,
    CheckpointStatistics,
    CheckpointStatus,
    ExternalCheckpoint,
    RestorePlan,
    SavepointRequest,
    TriggerRequest,
)
from contract.models.base import rules_extra

router = APIRouter(prefix="/api/v1/jobs/{job_id}", tags=["checkpoints"])


@router.post("/checkpoints", status_code=201, response_model=Checkpoint)
async def trigger_checkpoint(
    job_id: JobId, ctx: CtxDep, token_attempt: TokenAttempt, body: TriggerRequest | None = None
) -> Checkpoint:
    """Trigger a checkpoint now. 409 says why when max_concurrent, min_pause or the job's state refuse it."""
    body = body or TriggerRequest()
    async with ctx.tx() as s:
        job = await lock_job_as(s, job_id, token_attempt)
        cp = await trigger(
            s, job, now_ms(), policy=body.policy, targets=ctx.write_target, backpressure=ctx.backpressure
        )
        return views.checkpoint_model(cp)


@router.post("/savepoints", status_code=201, response_model=Checkpoint)
async def trigger_savepoint(
    job_id: JobId, ctx: CtxDep, token_attempt: TokenAttempt, body: SavepointRequest | None = None
) -> Checkpoint:
    """Trigger a savepoint: always aligned, never subsumed or collected. With stop=true the job ends when it completes."""
    body = body or SavepointRequest()
    async with ctx.tx() as s:
        job = await lock_job_as(s, job_id, token_attempt)
        cp = await trigger(s, job, now_ms(), savepoint=True, stop=body.stop, targets=ctx.write_target)
        return views.checkpoint_model(cp)


@router.post(
    "/checkpoints/external",
    status_code=201,
    response_model=Checkpoint,
    responses={200: {"model": Checkpoint, "description": "The same report was recorded before; nothing changed."}},
    openapi_extra=rules_extra(*ExternalCheckpoint.RULES),
)
async def report_checkpoint(
    job_id: JobId, body: ExternalCheckpoint, ctx: CtxDep, response: Response, token_attempt: TokenAttempt
) -> Checkpoint:
    """Record a checkpoint the engine completed on its own (a Structured Streaming micro-batch, keyed by batch id)."""
    async with ctx.tx() as s:
        job = await lock_job_as(s, job_id, token_attempt)
        cp, created = await record_external(s, job, body)
        response.status_code = 201 if created else 200
        return views.checkpoint_model(cp)


@router.get("/checkpoints", dependencies=TASK, response_model=CheckpointPage)
async def list_checkpoints(
    job_id: JobId,
    ctx: CtxDep,
    status: CheckpointStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Offset = 0,
) -> CheckpointPage:
    """Checkpoint history, newest first."""
    async with ctx.tx(readonly=True) as s:
        return await views.list_checkpoints(s, job_id, status, limit, offset)


@router.get("/checkpoints/stats", dependencies=TASK, response_model=CheckpointStatistics)
async def checkpoint_stats(
    job_id: JobId, ctx: CtxDep, history: Annotated[int, Query(ge=0, le=1000)] = 10
) -> CheckpointStatistics:
    """Counts, a min/avg/p50/p90/p99/max summary, the latest checkpoints and recent history (Flink's fields)."""
    async with ctx.tx(readonly=True) as s:
        return await statistics.statistics(s, job_id, history)


@router.get("/checkpoints/{checkpoint_id}", dependencies=TASK, response_model=CheckpointDetail)
async def get_checkpoint(job_id: JobId, checkpoint_id: CheckpointId, ctx: CtxDep) -> CheckpointDetail:
    async with ctx.tx(readonly=True) as s:
        return await views.checkpoint_detail(s, job_id, checkpoint_id)


@router.get(
    "/checkpoints/{checkpoint_id}/channel-state", dependencies=TASK, response_model=ChannelStateManifest
)
async def channel_state(job_id: JobId, checkpoint_id: CheckpointId, ctx: CtxDep) -> ChannelStateManifest:
    """The channel-state manifest of a checkpoint: per subtask, the segments of its single blob."""
    async with ctx.tx(readonly=True) as s:
        return await channel_state_views.channel_state_manifest(s, job_id, checkpoint_id)


@router.get("/restore-plan", dependencies=TASK, response_model=RestorePlan)
async def restore_plan(
    job_id: JobId, ctx: CtxDep, checkpoint_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None
) -> RestorePlan:
    """What restoring would load: the latest completed checkpoint, or the one named; verified, with fallbacks."""
    requested = checkpoint_id if checkpoint_id is not None else "latest"
    async with ctx.tx(readonly=True) as s:
        job = await get_job_or_404(s, job_id)
        return await build_plan(ctx, s, job, await select_checkpoint(s, job, requested), requested)
