"""The service's own answers: the one error shape of every 4xx/5xx, and health."""

from __future__ import annotations

from typing import Any

from pydantic import (
    Field,
)

from contract.models.base import (
    _Model,
)


class ErrorBody(_Model):
    code: str = Field(description="A stable machine-readable code, e.g. 'not_found', 'conflict'.")
    message: str = Field(description="What was wrong and what to do.")
    details: Any | None = None


class ErrorResponse(_Model):
    error: ErrorBody


class Health(_Model):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)
