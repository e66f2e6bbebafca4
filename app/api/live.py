"""Routes for the live metrics of running subtasks: a subtask reports its latest figures, the UI reads them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from app.api.deps import TASK, CtxDep, JobId, TaskToken
from app.domain import live_metrics
from contract.models import (
    MAX_ATTEMPT,
    MAX_PARALLELISM,
    NAME_PATTERN,
    JobLiveMetrics,
    SubtaskMetrics,
    SubtaskMetricsBatch,
    SubtaskMetricsBatchResult,
    SubtaskMetricsReport,
)
from contract.models.base import rules_extra

router = APIRouter(prefix="/api/v1/jobs/{job_id}", tags=["metrics"])


def _store(request: Request) -> live_metrics.LiveMetricsStore:
    return request.app.state.live_metrics


@router.post(
    "/attempts/{attempt}/subtasks/{vertex}/{subtask_index}/metrics",
    status_code=204,
    response_class=Response,
    openapi_extra=rules_extra(*SubtaskMetrics.RULES),
)
async def report_subtask_metrics(
    job_id: JobId,
    attempt: Annotated[int, Path(ge=1, le=MAX_ATTEMPT)],
    vertex: Annotated[str, Path(pattern=NAME_PATTERN)],
    subtask_index: Annotated[int, Path(ge=0, lt=MAX_PARALLELISM)],
    body: SubtaskMetricsReport,
    request: Request,
    ctx: CtxDep,
    token_attempt: TaskToken,
) -> Response:
    """A running subtask's latest metrics (records/s, backpressure, watermark and its lag). Idempotent: only the
    newest report of each subtask is kept, in the coordinator's memory; 409 when the attempt is no longer current
    or the job ended."""
    await live_metrics.report(ctx, _store(request), job_id, attempt, vertex, subtask_index, body, token_attempt)
    return Response(status_code=204)


@router.post(
    "/attempts/{attempt}/metrics/batch",
    response_model=SubtaskMetricsBatchResult,
    openapi_extra=rules_extra(*SubtaskMetrics.RULES),
)
async def report_subtask_metrics_batch(
    job_id: JobId,
    attempt: Annotated[int, Path(ge=1, le=MAX_ATTEMPT)],
    body: SubtaskMetricsBatch,
    request: Request,
    ctx: CtxDep,
    token_attempt: TaskToken,
) -> SubtaskMetricsBatchResult:
    """The latest metrics of several subtasks of one attempt in one request (a host's relay sends its subtasks'
    reports so), each kept as its own report would be, by its subtask and its own timestamp. 409 when the attempt
    is no longer current or the job ended (for the whole batch); a report naming no subtask of the job gets its 404
    in its item, and the others are kept."""
    return await live_metrics.report_batch(ctx, _store(request), job_id, attempt, body, token_attempt)


@router.get("/metrics", dependencies=TASK, response_model=JobLiveMetrics)
async def job_live_metrics(job_id: JobId, request: Request, ctx: CtxDep) -> JobLiveMetrics:
    """Per vertex of the job's current attempt: records/s, backpressure, and the low watermark with its lag from its
    subtasks' recent reports (empty while nothing reported, and once the job ended)."""
    async with ctx.tx(readonly=True) as s:
        return await live_metrics.live_view(s, _store(request), job_id)
