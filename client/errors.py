"""The SDK's exceptions, and the translation of the coordinator's error responses into them.

The coordinator answers every error with ``{"error": {"code", "message", "details"}}``; ``str(error)`` is the
server's message, so a caller can show it as it is.
"""

from __future__ import annotations

import json
from typing import Any

import httpx


class OvertakeError(Exception):
    """An error answered by the coordinator (or, for ``CoordinatorUnreachable``, no answer at all)."""

    def __init__(
        self,
        status_code: int | None,
        code: str,
        message: str,
        details: Any | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code
        self.message = message
        self.details = details

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status_code={self.status_code!r}, code={self.code!r}, message={self.message!r})"


class InvalidRequest(OvertakeError):
    """422/400: the request did not validate; the message names the field or the problem."""


class RangeNotSatisfiable(InvalidRequest):
    """416: a blob download asked for bytes past the blob's end."""


class Unauthorized(OvertakeError):
    """401: no token, or an unknown token."""


class Forbidden(OvertakeError):
    """403: the token is valid but not for this job or route."""


class NotFound(OvertakeError):
    """404: no such job, checkpoint or blob."""


class Conflict(OvertakeError):
    """409: the request contradicts the state (a different ack for the same subtask, an aborted checkpoint ...)."""


class TooLarge(OvertakeError):
    """413: the upload is larger than the coordinator accepts."""


class Unavailable(OvertakeError):
    """503/429 (or another 5xx): the coordinator cannot serve the request right now."""


class UnexpectedResponse(OvertakeError):
    """A success answer that is not what the coordinator's API answers: another server at that URL (a web page, a
    proxy's page), or a coordinator of an incompatible version. The message says what came instead."""


class CoordinatorUnreachable(OvertakeError):
    """No HTTP answer at all: connection refused, reset or timed out, after all retries."""

    def __init__(self, message: str, url: str) -> None:
        super().__init__(None, "unreachable", message)
        self.url = url


class OutcomeUnknown(CoordinatorUnreachable):
    """A request that is not safe to repeat was sent, and the connection failed before an answer came.

    The coordinator may or may not have applied it (e.g. a trigger): look before trying again.
    """


_BY_CODE: dict[str, type[OvertakeError]] = {
    "invalid": InvalidRequest,
    "range_not_satisfiable": RangeNotSatisfiable,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "conflict": Conflict,
    "too_large": TooLarge,
    "unavailable": Unavailable,
}

_BY_STATUS: dict[int, tuple[type[OvertakeError], str]] = {
    400: (InvalidRequest, "invalid"),
    401: (Unauthorized, "unauthorized"),
    403: (Forbidden, "forbidden"),
    404: (NotFound, "not_found"),
    409: (Conflict, "conflict"),
    413: (TooLarge, "too_large"),
    416: (RangeNotSatisfiable, "range_not_satisfiable"),
    422: (InvalidRequest, "invalid"),
    429: (Unavailable, "unavailable"),
    503: (Unavailable, "unavailable"),
}


def error_for_status(status: int, message: str, code: str | None = None, details: Any | None = None) -> OvertakeError:
    """The exception the SDK raises for an error answer with this status (and error code, when known): for an
    answer that came some other way than as a response, such as one item of a batch."""
    cls, default = _BY_STATUS.get(status, (Unavailable if status >= 500 else OvertakeError, f"http_{status}"))
    code = code or default
    return _BY_CODE.get(code, cls)(status, code, message, details)


def error_from_response(response: httpx.Response) -> OvertakeError:
    """The exception for an error response; reads the error shape, and copes with any other body."""
    status = response.status_code
    cls, code = _BY_STATUS.get(status, (Unavailable if status >= 500 else OvertakeError, f"http_{status}"))
    try:
        text = response.text
    except httpx.ResponseNotRead:
        text = ""
    body: Any = None
    try:
        body = json.loads(text) if text else None
    except ValueError:
        pass
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        code = str(error.get("code") or code)
        return _BY_CODE.get(code, cls)(status, code, error["message"], error.get("details"))
    if isinstance(body, dict) and "detail" in body:
        # a framework-level error that did not pass through the coordinator's error handler
        detail = body["detail"]
        message = detail if isinstance(detail, str) else f"HTTP {status}: {detail}"
        return cls(status, code, message, detail)
    where = f"{response.request.method} {response.request.url}"
    text = text.strip()[:300]
    return cls(
        status, code, f"HTTP {status} {response.reason_phrase} from {where}" + (f": {text}" if text else "")
    )
