"""A checkpoint as the coordinator triggers, decides and reports it: its status, type, policy decision and
figures, and the checkpoints an engine reports on its own."""

from __future__ import annotations

from enum import Enum
from typing import Any, ClassVar, Literal

from pydantic import (
    Field,
    model_validator,
)

from contract.models.base import (
    MAX_ATTEMPT,
    MAX_FIGURE,
    JsonObject,
    _Model,
)
from contract.models.config import BarrierPolicy


class CheckpointStatus(str, Enum):
    pending = "PENDING"
    completed = "COMPLETED"
    aborted = "ABORTED"


class CheckpointType(str, Enum):
    """What the coordinator decided for a checkpoint: its barrier policy (for the adaptive policy, what it chose);
    `aligned_then_unaligned` is aligned until the coordinator switched it to unaligned at its alignment timeout.
    What each subtask did is `Checkpoint.subtask_modes`."""

    aligned = "aligned"
    unaligned = "unaligned"
    savepoint = "savepoint"


class SubtaskModes(_Model):
    """How the acked subtasks took a checkpoint: the three counts add up to the acked subtasks."""

    unaligned: int = Field(description="Acked subtasks that took it unaligned.")
    aligned: int = Field(description="Acked subtasks that took it aligned as their barriers asked.")
    aligned_over_budget: int = Field(
        description="Acked subtasks that took it aligned because going unaligned would have passed the in-flight "
        "budget (over_inflight_budget=aligned)."
    )


class TriggerRequest(_Model):
    policy: BarrierPolicy | None = Field(default=None, description="Override the job's policy for this checkpoint.")


class SavepointRequest(_Model):
    stop: bool = Field(default=False, description="Stop the job once the savepoint completes.")


class PolicyDecision(_Model):
    """What the adaptive policy chose for one checkpoint, and why."""

    requested: BarrierPolicy = Field(description="The policy asked for (adaptive).")
    chosen: BarrierPolicy = Field(description="What the checkpoint's barriers carried: aligned_then_unaligned (with "
                                  "the budget as alignment timeout) or unaligned.")
    reason: str = Field(description="The rule that decided, with the figures it saw.")
    budget: int = Field(description="The alignment timeout the checkpoint was given (ms): the job's alignment budget, "
                                    "or for a calm guess a shorter one learned from the job's recent alignments.")
    backpressure: float | None = Field(
        default=None, description="Highest recent backpressure of the job's subtasks, when the coordinator had any."
    )
    based_on: int | None = Field(default=None, description="The finished checkpoint the decision looked at.")


class Checkpoint(_Model):
    id: int
    job_id: int
    attempt: int
    status: CheckpointStatus
    is_savepoint: bool
    checkpoint_type: CheckpointType = Field(
        description="What the coordinator decided: the barrier policy it triggered with (for the adaptive policy, "
        "the one it chose), unaligned once it switched an aligned_then_unaligned checkpoint; a savepoint is always "
        "aligned. What the subtasks did is `subtask_modes`."
    )
    subtask_modes: SubtaskModes
    policy: BarrierPolicy
    alignment_timeout: int | None
    trigger_timestamp: int
    latest_ack_timestamp: int | None
    completed_timestamp: int | None
    switched_to_unaligned_timestamp: int | None
    end_to_end_duration: int | None
    state_size: int
    persisted_data: int
    processed_data: int
    alignment_duration: int | None
    start_delay: int | None = Field(
        default=None,
        description="The longest start delay of its acks: from the trigger until a subtask's first barrier "
        "arrived. An aligned barrier waits behind the buffers queued in front of it, so under backpressure an "
        "aligned checkpoint's time goes here, not into alignment.",
    )
    num_subtasks: int
    num_acknowledged_subtasks: int
    failure_reason: str | None
    failure_timestamp: int | None = Field(default=None, description="When an aborted checkpoint was aborted.")
    abort_reason: (
        Literal["expired", "declined", "subsumed", "new_attempt", "job_cancelled", "job_ended"] | None
    ) = Field(
        default=None,
        description="Why an aborted checkpoint was aborted; only 'expired' and 'declined' are failures, the others "
        "were interrupted (the job ended, a new attempt started, a newer checkpoint completed).",
    )
    discarded: bool = Field(description="Its blobs were collected under the retention policy.")
    stop_job: bool = False
    details: dict[str, Any] | None = Field(
        default=None, description="For checkpoints reported by an engine: its own figures and source offsets."
    )
    decision: PolicyDecision | None = Field(
        default=None, description="For checkpoints of the adaptive policy: what it chose and why."
    )


class CheckpointPage(_Model):
    items: list[Checkpoint]
    total: int


class ExternalCheckpoint(_Model):
    """A checkpoint that an engine took on its own and reports once complete (a Structured Streaming micro-batch).

    Its id is the engine's (the batch id): ids must grow, and a restarted query continues them.
    """

    RULES: ClassVar[tuple[str, ...]] = ("completed_timestamp is not before trigger_timestamp.",)

    id: int = Field(ge=0, le=2**62, description="The engine's checkpoint id, e.g. the micro-batch id.")
    attempt: int | None = Field(
        default=None, ge=1, le=MAX_ATTEMPT, description="The attempt that took it; default: the current one."
    )
    trigger_timestamp: int = Field(ge=0, le=MAX_FIGURE, description="When it started (ms since the epoch).")
    completed_timestamp: int = Field(ge=0, le=MAX_FIGURE, description="When it was durable (ms since the epoch).")
    state_size: int = Field(default=0, ge=0, le=MAX_FIGURE)
    processed_data: int = Field(
        default=0, ge=0, le=MAX_FIGURE, description="Input processed, bytes or rows as the engine counts."
    )
    persisted_data: int = Field(default=0, ge=0, le=MAX_FIGURE)
    alignment_duration: int | None = Field(default=None, ge=0, le=MAX_FIGURE)
    source_offsets: JsonObject | None = None
    metrics: JsonObject = Field(default_factory=dict, description="Engine-specific figures, kept as they are.")

    @model_validator(mode="after")
    def _order(self) -> ExternalCheckpoint:
        if self.completed_timestamp < self.trigger_timestamp:
            raise ValueError(
                f"completed_timestamp {self.completed_timestamp} is before trigger_timestamp {self.trigger_timestamp}"
            )
        return self
