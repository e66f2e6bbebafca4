"""The ASGI fast path of the ack routes, the hottest of the service: every subtask acks every checkpoint, so these two
routes carry most of the traffic. `AckFastPath` serves them straight from ASGI, before the framework's routing,
dependency and exception layers (which cost more per request than recording the ack), with the handlers of
`app/api/ack_handlers.py` that the documented routes call too."""

from __future__ import annotations

import re
from typing import Any

from app.api.ack_handlers import error_answer, handle_ack, handle_ack_batch
from app.api.guards import read_body, respond, too_large
from app.db.session import TransientDatabaseError
from app.errors import DomainError, invalid_from
from contract.models import MAX_ID

BROWSER_HEADERS = (b"origin", b"sec-fetch-site")
ACK_PATH = re.compile(r"^/api/v1/jobs/([0-9]{1,20})/checkpoints/([0-9]{1,20})/acks(/batch)?$")


class AckFastPath:
    """ASGI middleware, the outermost of the app's own: POSTs to the two ack routes from clients that are not
    browsers go straight to their handlers; everything else (browsers' requests included, which the cross-origin
    guard must see) passes on through the guards to the routes. It applies the same body limit and body timeout
    (408 for a body that stalls), and answers a transient database failure of the token lookup with 503 (the
    committer retries its own transactions)."""

    def __init__(self, app: Any, *, max_body: int, body_timeout: float = 60.0) -> None:
        self.app = app
        self.max_body = max_body
        self.body_timeout = body_timeout

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        match = ACK_PATH.match(scope["path"])
        if match is None:
            return await self.app(scope, receive, send)
        authorization = None
        for name, value in scope["headers"]:
            if name in BROWSER_HEADERS:
                return await self.app(scope, receive, send)
            if name == b"authorization":
                authorization = value.decode("latin-1")
        body = await read_body(receive, send, self.max_body, self.body_timeout, too_large(self.max_body, streamed=False))
        if body is None:
            return
        job_id, checkpoint_id = int(match.group(1)), int(match.group(2))
        invalid = _path_problems(job_id, checkpoint_id)
        if invalid is not None:  # validated as the route's path parameters are (the spec's bounds)
            return await _respond(send, *error_answer(invalid))
        handler = handle_ack_batch if match.group(3) else handle_ack
        try:
            answer = await handler(scope["app"].state, job_id, checkpoint_id, body, authorization)
        except TransientDatabaseError as exc:
            return await respond(send, exc.unavailable())
        await _respond(send, *answer)


def _path_problems(job_id: int, checkpoint_id: int) -> DomainError | None:
    errors = []
    if not 1 <= job_id <= MAX_ID:
        errors.append({"loc": ["path", "job_id"], "msg": f"Input should be between 1 and {MAX_ID}"})
    if not 0 <= checkpoint_id <= MAX_ID:
        errors.append({"loc": ["path", "checkpoint_id"], "msg": f"Input should be between 0 and {MAX_ID}"})
    return invalid_from(errors) if errors else None


async def _respond(send, status: int, payload: bytes, extra: dict[str, str] | None = None) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
