"""The events the coordinator sends to a job's subtasks and followers, typed: one payload model per event type.

On the wire an event is :class:`~contract.models.Event` (``id``, ``job_id``, ``type``, ``timestamp``, ``data``)
and ``data`` is the JSON of the payload model of its ``type``. The coordinator builds every event from one of these
models; the runtime and the SDK read them back with :func:`payload_of`. Payloads ignore fields they do not know, so
a newer coordinator can add fields without breaking an older runtime.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from contract.models import (
    BarrierPolicy,
    Event,
    EventType,
    JobStatus,
    OverInflightBudget,
    PlanFallback,
    VertexRescale,
    WriteTarget,
)


class EventPayload(BaseModel):
    """The ``data`` of one event type; ``type`` names it."""

    model_config = ConfigDict(extra="ignore")
    type: ClassVar[EventType]

    def data(self) -> dict[str, Any]:
        """The JSON-compatible ``data`` of the event on the wire."""
        return self.model_dump(mode="json")


class CheckpointTriggered(EventPayload):
    """Checkpoint ``checkpoint_id`` was issued: sources record their offsets and send its barrier."""

    type: ClassVar[EventType] = EventType.checkpoint_triggered
    checkpoint_id: int
    attempt: int | None
    policy: BarrierPolicy
    alignment_timeout: int | None = Field(
        default=None, description="aligned_then_unaligned: ms after the trigger at which alignment turns unaligned."
    )
    trigger_timestamp: int
    inflight_budget: int | None = Field(
        default=None,
        description="The most in-flight bytes each subtask persists for this checkpoint; one that would pass it "
        "takes the checkpoint aligned or declines it (over_inflight_budget). None: no limit.",
    )
    over_inflight_budget: OverInflightBudget = "align"
    max_concurrent: int = Field(
        default=1,
        description="The job's checkpoint.max_concurrent: above 1, subtasks keep several unaligned checkpoints in "
        "progress at once (each with its own channel-state recording) and acknowledge them in id order.",
    )
    timeout_at: int | None = None
    is_savepoint: bool = False
    stop: bool = Field(default=False, description="A savepoint that stops the job once it completes.")
    external: bool = Field(default=False, description="Reported by an engine after the fact (no barrier to send).")
    target: WriteTarget | None = Field(
        default=None,
        description="Where subtasks write this checkpoint's state straight into the blob store; none: they upload "
        "it through the coordinator.",
    )


class SwitchToUnaligned(EventPayload):
    """Checkpoint ``checkpoint_id`` is still aligning past its alignment timeout: every subtask switches now."""

    type: ClassVar[EventType] = EventType.checkpoint_switch_to_unaligned
    checkpoint_id: int
    attempt: int | None
    alignment_timeout: int | None = None


class CheckpointCompleted(EventPayload):
    """Checkpoint ``checkpoint_id`` is complete and durable: exactly-once sinks commit its output."""

    type: ClassVar[EventType] = EventType.checkpoint_completed
    checkpoint_id: int
    attempt: int | None
    is_savepoint: bool = False
    checkpoint_type: str | None = None
    end_to_end_duration: int | None = None
    persisted_data: int = 0
    state_size: int = 0


class CheckpointAborted(EventPayload):
    """Checkpoint ``checkpoint_id`` was aborted: subtasks drop its work."""

    type: ClassVar[EventType] = EventType.checkpoint_aborted
    checkpoint_id: int
    attempt: int | None
    reason: str | None = None
    is_savepoint: bool = False


class AttemptStarted(EventPayload):
    """Attempt ``attempt`` of the job opened, restoring ``restored_checkpoint_id`` (None: a fresh start)."""

    type: ClassVar[EventType] = EventType.attempt_started
    attempt: int
    restored_checkpoint_id: int | None = None
    fallbacks: list[PlanFallback] = Field(default_factory=list)
    rescaled: list[VertexRescale] = Field(default_factory=list)
    reason: str | None = Field(default=None, description="Why the attempt started, as its starter said.")


class JobStatusChanged(EventPayload):
    """The job moved to ``status``; subtasks stop when it ended."""

    type: ClassVar[EventType] = EventType.job_status
    status: JobStatus
    message: str | None = None

    @property
    def ended(self) -> bool:
        return self.status in (JobStatus.cancelled, JobStatus.failed, JobStatus.finished)


CheckpointEvent = CheckpointTriggered | SwitchToUnaligned | CheckpointCompleted | CheckpointAborted

PAYLOADS: dict[EventType, type[EventPayload]] = {
    m.type: m
    for m in (
        CheckpointTriggered,
        SwitchToUnaligned,
        CheckpointCompleted,
        CheckpointAborted,
        AttemptStarted,
        JobStatusChanged,
    )
}


def payload_of(event: Event) -> EventPayload:
    """The typed payload of ``event`` (raises pydantic's ValidationError for a malformed one)."""
    return PAYLOADS[event.type].model_validate(event.data)
