"""Attempts of a job: how one opens (what it restores, a rescale), its subtasks reporting running, and its
history."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    ConfigDict,
    Field,
    model_validator,
)

from contract.models.base import (
    MAX_ATTEMPT,
    MAX_ID,
    MAX_PARALLELISM,
    NAME_PATTERN,
    _Model,
    _range,
)
from contract.models.restore import PlanFallback, RestorePlan, VertexRescale


@dataclass(frozen=True)
class AfterAttempt:
    """Restore where ``attempt`` left off: the newest checkpoint it completed, else the one it restored (none: a
    fresh start). The coordinator chooses it while it opens the next attempt, under the job's lock, so no late
    acknowledgement of that attempt can complete a newer checkpoint and have retention collect the chosen one first.
    A supervisor restarts with it (``restore_from=AfterAttempt(3)``)."""

    attempt: int

    def __post_init__(self) -> None:
        if isinstance(self.attempt, bool) or not isinstance(self.attempt, int) or not 1 <= self.attempt <= MAX_ATTEMPT:
            raise ValueError(f"an attempt number is an integer from 1 to {MAX_ATTEMPT}, not {self.attempt!r}")


class AttemptCreate(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "not": {
                "description": "restore_from_checkpoint and restore_after_attempt both given: give one.",
                "required": ["restore_from_checkpoint", "restore_after_attempt"],
                "properties": {
                    "restore_from_checkpoint": {"type": "integer"},
                    "restore_after_attempt": {"type": "integer"},
                },
            }
        }
    )
    RULES: ClassVar[tuple[str, ...]] = (
        "restore_from_checkpoint and restore_after_attempt are not both given (non-null).",
        "parallelism names vertices of the job, each within its max_parallelism.",
    )

    restore_from_checkpoint: int | None = Field(
        default=None,
        ge=1,
        le=MAX_ID,
        description="The checkpoint or savepoint id to restore from; wins over restore_latest.",
    )
    restore_latest: bool = Field(
        default=True,
        description="Without restore_from_checkpoint: restore the latest completed checkpoint (if any); "
        "false: a fresh start.",
    )
    restore_after_attempt: int | None = Field(
        default=None,
        ge=1,
        le=MAX_ATTEMPT,
        description="Restore where this attempt (the job's current one) left off: the newest checkpoint it "
        "completed, else the checkpoint it restored (none: a fresh start), chosen while the new attempt opens, so "
        "retention cannot collect it first; not with restore_from_checkpoint. The plan's requested_checkpoint says "
        "which was chosen.",
    )
    parallelism: dict[str, Annotated[int, Field(**_range(1, MAX_PARALLELISM))]] | None = Field(
        default=None,
        max_length=1000,
        description="Rescale: new parallelism per vertex id (within its max_parallelism); state is redistributed.",
    )
    wait_for_running: bool = Field(
        default=False,
        description="Periodic checkpoints of this attempt start one interval after every subtask reported running "
        "(POST .../attempts/{attempt}/running), not one interval after the attempt opened; if not all report "
        "within OVERTAKE_RUNNING_GRACE, they start then.",
    )
    reason: str | None = Field(
        default=None,
        max_length=2000,
        description="Why this attempt starts (a restart after a failure, a rescale to the slots a cluster offers); "
        "the job's status message while it runs, and part of the attempt.started event.",
    )

    @model_validator(mode="after")
    def _one_checkpoint(self) -> AttemptCreate:
        if self.restore_after_attempt is not None and self.restore_from_checkpoint is not None:
            raise ValueError(
                f"restore_from_checkpoint ({self.restore_from_checkpoint}) and restore_after_attempt "
                f"({self.restore_after_attempt}) both name what to restore; give one"
            )
        return self

    @property
    def restore_from(self) -> int | Literal["latest"] | AfterAttempt | None:
        """What to restore: a checkpoint id, 'latest', where an attempt left off, or None (a fresh start)."""
        if self.restore_after_attempt is not None:
            return AfterAttempt(self.restore_after_attempt)
        if self.restore_from_checkpoint is not None:
            return self.restore_from_checkpoint
        return "latest" if self.restore_latest else None

    @classmethod
    def restoring(cls, restore_from: int | Literal["latest"] | AfterAttempt | None, **fields: Any) -> AttemptCreate:
        """The body for `restore_from` as the SDK takes it: a checkpoint id, 'latest', an :class:`AfterAttempt` or
        None."""
        if isinstance(restore_from, AfterAttempt):
            return cls(restore_after_attempt=restore_from.attempt, restore_latest=False, **fields)
        if restore_from == "latest":
            return cls(restore_latest=True, **fields)
        if restore_from is None:
            return cls(restore_latest=False, **fields)
        if isinstance(restore_from, bool) or not isinstance(restore_from, int):
            raise ValueError(f"restore_from must be a checkpoint id, 'latest' or None, not {restore_from!r}")
        return cls(restore_from_checkpoint=restore_from, restore_latest=False, **fields)


class RunningReport(_Model):
    """A subtask of an attempt runs (its Spark task started it); idempotent."""

    vertex: str = Field(pattern=NAME_PATTERN)
    subtask_index: int = Field(ge=0, lt=MAX_PARALLELISM)


class RunningState(_Model):
    job_id: int
    attempt: int
    running_subtasks: int = Field(description="Subtasks of the attempt that reported running.")
    num_subtasks: int
    all_running_at: int | None = Field(description="When the last subtask reported running (null: not yet).")


class RecoveryPhases(_Model):
    """How long each phase of an attempt's recovery took (ms), as far as this coordinator knows; a phase it does not
    know is null. Measured with the coordinator's clock and the executors' (the subtasks' reports)."""

    detect_ms: int | None = Field(
        default=None,
        description="From the previous attempt's last live-metrics report to this attempt's start: noticing the "
        "failure and opening a new attempt (up to a report interval, about a second, longer than it was). Null when "
        "no report of the previous attempt was received, or its last came after this attempt started.",
    )
    relaunch_ms: int | None = Field(
        default=None,
        description="From this attempt's start to the first of its restored subtasks' loops running: launching the "
        "tasks, and that subtask's restore.",
    )
    restore_ms: int | None = Field(
        default=None, description="The longest time a subtask spent fetching and loading its state before its loop ran."
    )
    replay_ms: int | None = Field(
        default=None,
        description="From the first restored subtask's loop running to the last subtask's replay finished; null "
        "until every subtask of the attempt reported the end of its replay.",
    )
    replaying: int | None = Field(
        default=None, description="Restored subtasks whose latest report says they still replay."
    )
    replay_finished_at: int | None = Field(
        default=None, description="When the last subtask's replay finished (ms since the epoch)."
    )


class AttemptInfo(_Model):
    """One attempt of a job as it happened: when it ran, what it restored, what it passed over and rescaled."""

    attempt: int
    started_at: int
    ended_at: int | None = Field(description="When a newer attempt started or the job ended (null: current).")
    restored_checkpoint_id: int | None = Field(description="The checkpoint it restored (null: a fresh start).")
    restored_is_savepoint: bool = False
    reason: str | None = Field(
        default=None,
        description="Why it started, as its runtime said (a restart after a failure and what was lost, a rescale, a "
        "wait for task slots).",
    )
    fallbacks: list[PlanFallback] = Field(
        default_factory=list, description="Checkpoints its restore passed over, newest first, and why."
    )
    rescaled: list[VertexRescale] = Field(
        default_factory=list, description="Vertices it ran with another parallelism than the restored checkpoint."
    )
    recorded: bool = Field(
        default=True,
        description="False when the attempt's start event is no longer in the event log (older than the "
        "retention of events): fallbacks and rescaling are then unknown.",
    )
    end_reason: str | None = Field(
        default=None,
        description="Why it ended: the reason the next attempt started with (the failure a restart followed, a "
        "rescale), or how the job ended for its last attempt; null while it runs or when nothing was said.",
    )
    phases: RecoveryPhases | None = Field(
        default=None,
        description="The current attempt's recovery phases, from the live metrics its subtasks (and the previous "
        "attempt's) reported. Those are kept only in the memory of the coordinator replica that received them, for "
        "the current attempt: null for older attempts, and after a coordinator restart or on another replica until "
        "the subtasks report again (then detect, and the start of what ended before, may stay unknown).",
    )


class AttemptPage(_Model):
    items: list[AttemptInfo] = Field(description="Newest first.")
    total: int


class Attempt(_Model):
    job_id: int
    attempt: int
    task_token: str | None = Field(default=None, description="Job-scoped task token; shown once, at creation.")
    started_at: int
    restore_plan: RestorePlan
