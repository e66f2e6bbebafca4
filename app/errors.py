"""Domain errors and the one JSON error shape they are sent as: each error carries the HTTP status, a stable code
and a message that says what was wrong and what to do; `error_payload` builds ``{"error": {code, message,
details}}`` for every route, the ack fast path included."""

from __future__ import annotations

import json
from typing import Any


class DomainError(Exception):
    status_code = 400
    code = "bad_request"
    headers: dict[str, str] = {}

    def __init__(self, message: str, details: Any | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class Invalid(DomainError):
    status_code = 422
    code = "invalid"


class NotFound(DomainError):
    status_code = 404
    code = "not_found"


class Conflict(DomainError):
    status_code = 409
    code = "conflict"


class Unauthorized(DomainError):
    status_code = 401
    code = "unauthorized"


class Forbidden(DomainError):
    status_code = 403
    code = "forbidden"


class TooLarge(DomainError):
    status_code = 413
    code = "too_large"


class RequestTimeout(DomainError):
    status_code = 408
    code = "request_timeout"


class RangeNotSatisfiable(DomainError):
    status_code = 416
    code = "range_not_satisfiable"


class Unavailable(DomainError):
    """The coordinator cannot serve the request right now (its database is busy or away); retry after a moment."""

    status_code = 503
    code = "unavailable"
    headers = {"Retry-After": "1"}


class Internal(DomainError):
    status_code = 500
    code = "internal"


def error_payload(code: str, message: str, details: Any | None = None) -> dict[str, Any]:
    """The one JSON error shape of the API: ``{"error": {"code", "message", "details"}}``."""
    body: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        body["details"] = details
    return {"error": body}


def error_json(exc: DomainError) -> bytes:
    """`exc` as the JSON bytes of the error shape (for the ASGI fast paths that answer without the framework)."""
    return json.dumps(error_payload(exc.code, exc.message, exc.details)).encode()


def invalid_from(errors: list[dict], prefix: tuple = ()) -> Invalid:
    """A 422 from pydantic's or FastAPI's validation errors, every location prefixed with `prefix`. An error met
    twice (a path parameter that the route and its auth dependency both validate) is said once."""
    details: list[dict] = []
    for e in errors:
        detail = {"loc": [*prefix, *e.get("loc", ())], "msg": e.get("msg")}
        if detail not in details:
            details.append(detail)
    return Invalid(validation_message(details), details=details)


def validation_message(errors: list[dict]) -> str:
    """One readable line from pydantic's errors: `graph.vertices.0.parallelism: Input should be ...; ...`."""
    parts = []
    for err in errors:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "request"
        msg = err.get("msg", "invalid")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts) or "the request is invalid"
