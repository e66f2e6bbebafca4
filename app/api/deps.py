"""Route dependencies as annotated types: the context, the ack committer and auth checks."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from app.auth import Auth
from app.domain.acks import AckCommitter
from app.domain.context import Context


def get_ctx(request: Request) -> Context:
    return request.app.state.ctx


def get_committer(request: Request) -> AckCommitter:
    return request.app.state.committer


def get_auth(request: Request) -> Auth:
    return request.app.state.auth


async def admin_only(request: Request) -> None:
    await request.app.state.auth.require_admin(request)


async def job_access(request: Request, job_id: Annotated[int, Path(ge=1)]) -> None:
    await request.app.state.auth.require_job(request, job_id)


CtxDep = Annotated[Context, Depends(get_ctx)]
CommitterDep = Annotated[AckCommitter, Depends(get_committer)]
JobId = Annotated[int, Path(ge=1, description="Job id")]
CheckpointId = Annotated[int, Path(ge=0, description="Checkpoint id")]
ADMIN = [Depends(admin_only)]
TASK = [Depends(job_access)]
