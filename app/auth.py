"""Bearer-token auth: the admin token for management routes, an attempt's task token (stored hashed) for the routes
its subtasks use. A task token works only while its attempt is the job's current one and the job has not ended."""

from __future__ import annotations

import hashlib
import logging
import secrets

from fastapi import Request

from app.domain.context import Context
from app.domain.jobs import attempt_for_token, check_token_attempt
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
        self._token_attempts: dict[str, tuple[int, int]] = {}  # never changes for a token, so it is cached

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

    async def require_job(self, request: Request, job_id: int) -> int | None:
        """Admin token, or the task token of this job's current attempt: returns that attempt (None for the admin
        token, or without auth). A route that changes the job checks it again under the job row lock
        (`jobs.lock_job_as`): the attempt may end between this check and the route's transaction."""
        if not self.enabled:
            return None
        attempt = await self.require_job_header(request.headers.get("authorization"), job_id)
        if attempt is not None:
            async with self.ctx.tx(readonly=True) as s:
                refusal = await check_token_attempt(s, job_id, attempt)
            if refusal is not None:
                raise Unauthorized(refusal)
        return attempt

    async def require_job_header(self, authorization: str | None, job_id: int) -> int | None:
        """As `require_job`, from the raw Authorization header, without checking that the token's attempt is still
        current: returns that attempt (None for the admin token, or without auth), for the caller to check in its
        own transaction (the ack path does, under the job row lock)."""
        if not self.enabled:
            return None
        token = _token(authorization)
        if token is None:
            raise Unauthorized(
                f"this route needs a token: job {job_id}'s task token (from starting an attempt) or the admin token"
            )
        if self._is_admin(token):
            return None
        owner = await self._attempt_of(token)
        if owner is None:
            raise Unauthorized("the token is not valid for this coordinator")
        if owner[0] != job_id:
            raise Forbidden(f"this task token belongs to job {owner[0]}, not job {job_id}")
        return owner[1]

    async def _job_of(self, token: str) -> int | None:
        owner = await self._attempt_of(token)
        return owner[0] if owner is not None else None

    async def _attempt_of(self, token: str) -> tuple[int, int] | None:
        digest = hashlib.sha256(token.encode()).hexdigest()
        if digest in self._token_attempts:
            return self._token_attempts[digest]
        async with self.ctx.tx(readonly=True) as s:
            owner = await attempt_for_token(s, token)
        if owner is not None:
            if len(self._token_attempts) > 100_000:
                self._token_attempts.clear()
            self._token_attempts[digest] = owner
        return owner
