"""Route dependencies as annotated types: the context, the ack committer and auth checks."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Query, Request

from app.auth import Auth
from app.domain.acks import AckCommitter
from app.domain.context import Context
from contract.models import MAX_ID


def get_ctx(request: Request) -> Context:
    return request.app.state.ctx


def get_committer(request: Request) -> AckCommitter:
    return request.app.state.committer


def get_auth(request: Request) -> Auth:
    return request.app.state.auth


async def admin_only(request: Request) -> None:
    await request.app.state.auth.require_admin(request)


async def job_access(request: Request, job_id: Annotated[int, Path(ge=1, le=MAX_ID)]) -> int | None:
    """The admin token, or the task token of the job's current attempt: that attempt (None: admin, or no auth)."""
    return await request.app.state.auth.require_job(request, job_id)


async def task_token(request: Request, job_id: Annotated[int, Path(ge=1, le=MAX_ID)]) -> int | None:
    """The admin token, or a task token of the job: its attempt (None: admin, or no auth), without reading the job
    (a token's job and attempt never change, and are cached). For a route that checks the attempt itself against
    what it knows of the job (`TaskToken`)."""
    return await request.app.state.auth.require_job_header(request.headers.get("authorization"), job_id)


CtxDep = Annotated[Context, Depends(get_ctx)]
CommitterDep = Annotated[AckCommitter, Depends(get_committer)]
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="Job id")]
CheckpointId = Annotated[int, Path(ge=0, le=MAX_ID, description="Checkpoint id")]
BlobId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", description="A blob id the coordinator issued")]
Offset = Annotated[int, Query(ge=0, le=MAX_ID)]
TokenAttempt = Annotated[int | None, Depends(job_access)]
"""The attempt of the request's task token (None: the admin token, or no auth), after the job's access check (as
`TASK`): a route that changes the job checks it again under the job row lock (`app.domain.jobs.lock_job_as`); the
event stream ends with a later attempt's start."""
TaskToken = Annotated[int | None, Depends(task_token)]
"""As `TokenAttempt`, but the attempt is not checked yet: the route does (the metrics reports, at most one read of
the job per second instead of one per report)."""
ADMIN = [Depends(admin_only)]
TASK = [Depends(job_access)]
