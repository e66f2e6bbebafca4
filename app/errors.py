"""Domain errors: each carries the HTTP status and a message that says what was wrong and what to do."""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    status_code = 400
    code = "bad_request"

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


class RangeNotSatisfiable(DomainError):
    status_code = 416
    code = "range_not_satisfiable"


class Unavailable(DomainError):
    status_code = 503
    code = "unavailable"


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
