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
