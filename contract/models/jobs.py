"""A job as the API creates, shows and finishes it: its name, graph, checkpoint config, labels and status."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, ClassVar, Literal

from pydantic import (
    Field,
    StringConstraints,
    field_validator,
)

from contract.models.base import (
    MAX_ATTEMPT,
    NAME_PATTERN,
    NAME_RE,
    _Model,
)
from contract.models.config import CheckpointConfig
from contract.models.graph import Graph

LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=128)]
LabelValue = Annotated[str, StringConstraints(max_length=1024)]


class JobCreate(_Model):
    RULES: ClassVar[tuple[str, ...]] = (
        "Vertex ids are unique in the graph.",
        "A vertex's max_parallelism is at least its parallelism (128 when not given).",
        "An edge's source and target are vertices of the graph, different from each other; each (source, target) "
        "pair appears once; the edges make no cycle.",
        "A forward edge connects vertices of equal parallelism.",
        "The graph has at most 100000 subtasks (the sum of its vertices' parallelism).",
        "checkpoint.alignment_timeout is given only for the policies aligned_then_unaligned and adaptive, and is "
        "below checkpoint.timeout (600000 when not given).",
        "checkpoint.max_inflight_bytes and max_inflight_bytes_per_subtask are given only for policies that can "
        "take a checkpoint unaligned (not aligned).",
    )

    name: str = Field(
        json_schema_extra={"pattern": NAME_PATTERN}, description="Job name ([A-Za-z0-9_.-], at most 128 characters)."
    )
    graph: Graph
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    kind: Literal["pipeline", "structured_streaming"] = "pipeline"
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=64)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(f"job name {v!r} must be 1-128 characters of letters, digits, '_', '.', '-'")
        return v


class JobStatus(str, Enum):
    created = "CREATED"
    running = "RUNNING"
    failing = "FAILING"
    finished = "FINISHED"
    failed = "FAILED"
    cancelled = "CANCELLED"


TERMINAL_JOB_STATUSES = {JobStatus.finished, JobStatus.failed, JobStatus.cancelled}


class Job(_Model):
    id: int
    name: str
    kind: str
    status: JobStatus
    graph: Graph
    checkpoint: CheckpointConfig
    labels: dict[str, str]
    current_attempt: int | None
    created_at: int
    updated_at: int
    status_message: str | None = None
    consecutive_failures: int = 0
    latest_completed_checkpoint_id: int | None = None
    latest_completed_at: int | None = None
    num_completed: int = 0
    num_failed: int = Field(
        default=0, description="Failed checkpoints: aborted because they expired or a subtask declined them."
    )
    num_in_progress: int = 0
    num_not_finished: int = Field(
        default=0,
        description="Not finished, not failures: aborted because the job ended or was cancelled, a new attempt "
        "started, or a newer checkpoint completed first. num_failed + num_not_finished are the aborted ones.",
    )
    num_interrupted: int = Field(default=0, description="The same as num_not_finished (its former name).")
    scheduler_error: str | None = Field(
        default=None, description="The scheduler's last failure on this job (cleared by its next periodic trigger)."
    )
    running_at: int | None = Field(
        default=None, description="When every subtask of the current attempt had reported running."
    )


class JobPage(_Model):
    items: list[Job]
    total: int


class JobFinish(_Model):
    status: Literal["FINISHED", "FAILED"]
    message: str | None = Field(default=None, max_length=100_000)
    attempt: int | None = Field(
        default=None, ge=1, le=MAX_ATTEMPT, description="If given, only this attempt may finish the job."
    )
