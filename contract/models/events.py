"""The event envelope of a job's event stream: its type and sequence number (payloads: ``contract.events``)."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import (
    Field,
)

from contract.models.base import (
    _Model,
)


class EventType(str, Enum):
    checkpoint_triggered = "checkpoint.triggered"
    checkpoint_switch_to_unaligned = "checkpoint.switch_to_unaligned"
    checkpoint_completed = "checkpoint.completed"
    checkpoint_aborted = "checkpoint.aborted"
    attempt_started = "attempt.started"
    job_status = "job.status"


class Event(_Model):
    id: int = Field(description="Per-job sequence number; resume with Last-Event-ID.")
    job_id: int
    type: EventType
    timestamp: int
    data: dict[str, Any]
    deployment: str | None = Field(
        default=None,
        description="The coordinator deployment the event belongs to (its namespace); replicas of one deployment share it.",
    )
