"""Bearer-token auth: the admin token for management routes, a job's task token (stored hashed) for task routes."""

from __future__ import annotations

import hashlib
import logging
import secrets

from fastapi import Request

from app.domain.context import Context
from app.domain.jobs import job_for_token
from app.errors import Forbidden, Unauthorized

log = logging.getLogger(__name__)


def _bearer(request: Request) -> str | None:
    return _token(request.headers.get("authorization"))


def _token(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("the Authorization header must be 'Bearer <token>'")
    return token.strip()


class Auth:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.admin_token = ctx.settings.admin_token
        self._token_jobs: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.admin_token)

    def _is_admin(self, token: str | None) -> bool:
        return token is not None and secrets.compare_digest(token.encode(), self.admin_token.encode())

    async def require_admin(self, request: Request) -> None:
        if not self.enabled:
            return
        token = _bearer(request)
        if token is None:
            raise Unauthorized(
                "this route needs the admin token: send 'Authorization: Bearer <OVERTAKE_ADMIN_TOKEN>'"
            )
        if not self._is_admin(token):
            if await self._job_of(token) is not None:
                raise Forbidden("a task token cannot use management routes; use the admin token")
            raise Unauthorized("the token is not valid for this coordinator")

    async def require_job(self, request: Request, job_id: int) -> None:
        """Admin token, or the task token of this job."""
        if self.enabled:
            await self.require_job_header(request.headers.get("authorization"), job_id)

    async def require_job_header(self, authorization: str | None, job_id: int) -> None:
        """As `require_job`, from the raw Authorization header (for the ack fast path)."""
        if not self.enabled:
            return
        token = _token(authorization)
        if token is None:
            raise Unauthorized(
                f"this route needs a token: job {job_id}'s task token (from starting an attempt) or the admin token"
            )
        if self._is_admin(token):
            return
        owner = await self._job_of(token)
        if owner is None:
            raise Unauthorized("the token is not valid for this coordinator")
        if owner != job_id:
            raise Forbidden(f"this task token belongs to job {owner}, not job {job_id}")

    async def _job_of(self, token: str) -> int | None:
        digest = hashlib.sha256(token.encode()).hexdigest()
        if digest in self._token_jobs:
            return self._token_jobs[digest]
        async with self.ctx.tx(readonly=True) as s:
            job_id = await job_for_token(s, token)
        if job_id is not None:
            if len(self._token_jobs) > 100_000:
                self._token_jobs.clear()
            self._token_jobs[digest] = job_id
        return job_id
