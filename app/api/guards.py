"""The guards around every request. `CrossOriginGuard`: without auth, a browser's state-changing request from
another origin is refused (a page elsewhere must not cancel a job). `RequestGuard`: request bodies are limited (counted while they arrive, 413 naming the limit as
soon as one passes it), and a request whose transaction failed transiently (a deadlock, a serialization failure,
a lost connection) runs again a bounded number of times, otherwise it is answered 503 with Retry-After.

JSON and other small bodies are read whole (up to `OVERTAKE_MAX_REQUEST_BODY`) before the app sees them, so they
can be replayed; uploads (`application/octet-stream`, `multipart/form-data`) stream through, counted against the
upload limit, and are answered 503 instead of replayed (the SDK retries them: they are idempotent).
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
from typing import Any

from app.db.session import TransientDatabaseError
from app.errors import DomainError, Forbidden, RequestTimeout, TooLarge, error_json

log = logging.getLogger(__name__)
STREAMED = (b"multipart/form-data", b"application/octet-stream")


async def respond(send, error: DomainError) -> None:
    """Answer with the one JSON error shape."""
    payload = error_json(error)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def too_large(limit: int, streamed: bool) -> TooLarge:
    setting = "OVERTAKE_MAX_BLOB_SIZE" if streamed else "OVERTAKE_MAX_REQUEST_BODY"
    return TooLarge(
        f"the request body exceeds the coordinator's limit of {limit} bytes for "
        + ("uploads" if streamed else "request bodies")
        + f" ({setting}); nothing was changed",
        details={"limit": limit},
    )


def body_timeout(seconds: float) -> RequestTimeout:
    return RequestTimeout(
        f"no byte of the request body arrived for {seconds:g} s (OVERTAKE_BODY_TIMEOUT): the body is shorter than "
        "its Content-Length, or the client stalled; nothing was changed"
    )


async def receive_within(receive, seconds: float) -> dict:
    """The request's next message, or `RequestTimeout` when none came within `seconds`: a client that stalls or
    sends less than its Content-Length would otherwise hold its request (and whatever it waits for) open for good."""
    try:
        if sys.version_info >= (3, 11):  # no task of its own per read, on the ack path
            async with asyncio.timeout(seconds):
                return await receive()
        return await asyncio.wait_for(receive(), seconds)
    except asyncio.TimeoutError:
        raise body_timeout(seconds) from None


async def read_body(receive, send, limit: int, seconds: float, too_big: DomainError) -> bytes | None:
    """A request's whole body, each part awaited at most ``seconds``; None when the request was answered here
    (``too_big`` past ``limit`` bytes, a part that did not come in time) or the client went away."""
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            message = await receive_within(receive, seconds)
        except RequestTimeout as exc:
            await respond(send, exc)
            return None
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            await respond(send, too_big)
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)  # one part: no copy


def _header(scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


class RequestGuard:
    """ASGI middleware: body limits and bounded retries of transient database failures (see the module)."""

    def __init__(self, app: Any, *, max_body: int, max_upload: int, retries: int = 4, body_timeout: float = 60.0) -> None:
        self.app = app
        self.max_body = max_body
        self.max_upload = max_upload
        self.retries = retries
        self.body_timeout = body_timeout

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        ctype = (_header(scope, b"content-type") or b"").lower()
        streamed = ctype.startswith(STREAMED)
        limit = self.max_upload if streamed else self.max_body
        refused = too_large(limit, streamed)
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return await respond(send, refused)
        started = False

        async def tracked_send(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        if streamed:
            received = 0

            async def counted() -> dict:
                nonlocal received
                message = await receive_within(receive, self.body_timeout)
                received += len(message.get("body", b""))
                if received > limit:
                    raise refused
                return message

            try:
                return await self.app(scope, counted, tracked_send)
            except (TooLarge, RequestTimeout) as refused:  # raised from a read the app does not answer itself
                if not started:
                    return await respond(send, refused)
                raise
            except TransientDatabaseError as exc:
                if not started:
                    return await respond(send, exc.unavailable())
                raise
        body = await read_body(receive, send, limit, self.body_timeout, refused)
        if body is None:
            return
        for attempt in range(self.retries + 1):
            delivered = False

            async def replay() -> dict:
                nonlocal delivered
                if not delivered:
                    delivered = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            try:
                return await self.app(scope, replay, tracked_send)
            except TransientDatabaseError as exc:
                if started:
                    raise
                if attempt == self.retries:
                    log.warning("%s %s failed %d times transiently: %s", scope["method"], scope["path"], attempt + 1, exc)
                    return await respond(send, exc.unavailable())
                await asyncio.sleep(random.uniform(0.005, 0.02) * 2**attempt)


UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}
UI_HEADER = b"x-overtake-client"


class CrossOriginGuard:
    """ASGI middleware for a coordinator without auth: a state-changing request is refused (403) when a browser
    sends it from another origin: its `Origin` is neither the coordinator's own nor in `OVERTAKE_CORS_ORIGINS`, or,
    without `Origin`, `Sec-Fetch-Site` says cross-site. A request with the `X-Overtake-Client` header passes (a page
    of another origin cannot send it without a CORS preflight, which only allowed origins pass), and so do
    requests that are not from a browser (no `Origin`, no `Sec-Fetch-Site`: the SDK, the runtime, curl)."""

    def __init__(self, app: Any, *, enabled: bool, allowed_origins: list[str]) -> None:
        self.app = app
        self.enabled = enabled
        self.allowed = {o.rstrip("/").lower() for o in allowed_origins}

    async def __call__(self, scope, receive, send) -> None:
        if not self.enabled or scope["type"] != "http" or scope["method"] not in UNSAFE:
            return await self.app(scope, receive, send)
        if _header(scope, UI_HEADER) is not None:
            return await self.app(scope, receive, send)
        origin = (_header(scope, b"origin") or b"").decode("latin-1").rstrip("/").lower()
        site = (_header(scope, b"sec-fetch-site") or b"").decode("latin-1").lower()
        if origin and origin != "null":
            host = (_header(scope, b"host") or b"").decode("latin-1").lower()
            own = {f"{scope.get('scheme', 'http')}://{host}", f"http://{host}", f"https://{host}"}
            if origin in own or origin in self.allowed:
                return await self.app(scope, receive, send)
        elif not origin and site not in ("cross-site", "same-site"):
            return await self.app(scope, receive, send)
        refused = Forbidden(
            f"a {scope['method']} from origin {origin or site!r} is refused: this coordinator runs without "
            "authentication and accepts state-changing requests only from its own origin, the origins in "
            "OVERTAKE_CORS_ORIGINS, or clients that are not browsers; set OVERTAKE_ADMIN_TOKEN to use tokens"
        )
        await respond(send, refused)
