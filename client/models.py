"""The API's wire models: the request and response bodies shared by the coordinator and the SDK.

Field names of the statistics follow Flink's checkpoint REST API (``end_to_end_duration``,
``state_size``, ``persisted_data``, ``processed_data``, ``num_acknowledged_subtasks`` ...).
Durations are milliseconds, timestamps are milliseconds since the epoch, sizes are bytes.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- graph and config


class Partitioning(str, Enum):
    forward = "forward"
    rebalance = "rebalance"
    hash = "hash"
    broadcast = "broadcast"


class BarrierPolicy(str, Enum):
    aligned = "aligned"
    unaligned = "unaligned"
    aligned_then_unaligned = "aligned_then_unaligned"


class Vertex(_Model):
    id: str = Field(description="Operator id, unique in the job ([A-Za-z0-9_.-], at most 128 characters).")
    name: str | None = Field(default=None, description="Display name; defaults to the id.")
    parallelism: int = Field(description="Number of subtasks (at least 1).")
    max_parallelism: int = Field(
        default=128, description="Number of key groups; the upper bound for rescaling (at least parallelism)."
    )
    kind: Literal["source", "operator", "sink"] = "operator"
    keyed: bool = Field(default=False, description="Whether the vertex keeps keyed state (addressed by key group).")


class Edge(_Model):
    source: str = Field(description="Upstream vertex id.")
    target: str = Field(description="Downstream vertex id.")
    partitioning: Partitioning = Partitioning.forward


class Graph(_Model):
    vertices: list[Vertex] = Field(min_length=1)
    edges: list[Edge] = Field(default_factory=list)


class CheckpointConfig(_Model):
    interval: int | None = Field(
        default=None, description="Periodic trigger interval in ms; null disables periodic checkpoints."
    )
    timeout: int = Field(default=600_000, description="A checkpoint pending longer than this (ms) is aborted.")
    min_pause: int = Field(default=0, description="Minimum pause (ms) between the end of one checkpoint and the next trigger.")
    max_concurrent: int = Field(default=1, description="Maximum number of pending checkpoints.")
    policy: BarrierPolicy = BarrierPolicy.aligned_then_unaligned
    alignment_timeout: int | None = Field(
        default=None,
        description="For aligned_then_unaligned: ms after the trigger at which alignment switches to unaligned.",
    )
    tolerable_failures: int = Field(
        default=0, description="Consecutive failed checkpoints tolerated before the job is marked failing."
    )
    retained: int = Field(default=1, description="Completed checkpoints kept (savepoints are never collected).")


class JobCreate(_Model):
    name: str = Field(description="Job name ([A-Za-z0-9_.-], at most 128 characters).")
    graph: Graph
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    kind: Literal["pipeline", "structured_streaming"] = "pipeline"
    labels: dict[str, str] = Field(default_factory=dict)

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
    num_failed: int = 0
    num_in_progress: int = 0


class JobPage(_Model):
    items: list[Job]
    total: int


class JobFinish(_Model):
    status: Literal["FINISHED", "FAILED"]
    message: str | None = None
    attempt: int | None = Field(default=None, description="If given, only this attempt may finish the job.")


# --------------------------------------------------------------------------- attempts and restore plans


class AttemptCreate(_Model):
    restore_from: int | Literal["latest"] | None = Field(
        default="latest",
        description="Checkpoint or savepoint id to restore from; 'latest' (the latest completed, if any) or null for a fresh start.",
    )
    parallelism: dict[str, int] | None = Field(
        default=None,
        description="Rescale: new parallelism per vertex id (within its max_parallelism); state is redistributed.",
    )


class ChannelSegment(_Model):
    """One channel's bytes inside a subtask's channel-state blob."""

    channel: str = Field(description="Channel name, e.g. 'in:map[0]->reduce[1]' or 'out:map[0]->reduce[1]'.")
    direction: Literal["input", "output"]
    offset: int = Field(ge=0)
    length: int = Field(ge=0)
    buffer_count: int = Field(ge=0)
    record_count: int = Field(ge=0)
    peer_vertex: str | None = None
    peer_subtask: int | None = None
    partitioning: Partitioning | None = None


class BlobRef(_Model):
    blob_id: str
    sha256: str
    size: int = Field(ge=0)


class RestoreState(_Model):
    """A slice of operator state to load: a blob, and the key-group range of it that this subtask owns."""

    blob_id: str
    sha256: str
    size: int
    from_subtask: int
    key_group_start: int | None = None
    key_group_end: int | None = None


class RestoreSegment(ChannelSegment):
    blob_id: str
    from_subtask: int


class SubtaskRestore(_Model):
    vertex: str
    subtask_index: int
    key_group_start: int | None = None
    key_group_end: int | None = None
    operator_state: list[RestoreState] = Field(default_factory=list)
    output_channel_state: list[RestoreSegment] = Field(default_factory=list)
    input_channel_state: list[RestoreSegment] = Field(default_factory=list)
    source_offsets: dict[str, Any] | None = None


class PlanFallback(_Model):
    checkpoint_id: int
    reason: str


class RestorePlan(_Model):
    job_id: int
    checkpoint_id: int | None = Field(description="The checkpoint restored, or null for a fresh start.")
    is_savepoint: bool = False
    requested: int | Literal["latest"] | None = None
    fallbacks: list[PlanFallback] = Field(
        default_factory=list, description="Checkpoints passed over because a blob was missing or corrupt."
    )
    subtasks: list[SubtaskRestore] = Field(default_factory=list)


class Attempt(_Model):
    job_id: int
    attempt: int
    task_token: str | None = Field(default=None, description="Job-scoped task token; shown once, at creation.")
    started_at: int
    restore_plan: RestorePlan


# --------------------------------------------------------------------------- checkpoints


class CheckpointStatus(str, Enum):
    pending = "PENDING"
    completed = "COMPLETED"
    aborted = "ABORTED"


class CheckpointType(str, Enum):
    aligned = "aligned"
    unaligned = "unaligned"
    savepoint = "savepoint"


class TriggerRequest(_Model):
    policy: BarrierPolicy | None = Field(default=None, description="Override the job's policy for this checkpoint.")


class SavepointRequest(_Model):
    stop: bool = Field(default=False, description="Stop the job once the savepoint completes.")


class Checkpoint(_Model):
    id: int
    job_id: int
    attempt: int
    status: CheckpointStatus
    is_savepoint: bool
    checkpoint_type: CheckpointType
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
    num_subtasks: int
    num_acknowledged_subtasks: int
    failure_reason: str | None
    discarded: bool = Field(description="Its blobs were collected under the retention policy.")
    stop_job: bool = False
    details: dict[str, Any] | None = Field(
        default=None, description="For checkpoints reported by an engine: its own figures and source offsets."
    )


class CheckpointPage(_Model):
    items: list[Checkpoint]
    total: int


class AckMetrics(_Model):
    sync_duration: int = Field(default=0, ge=0)
    async_duration: int = Field(default=0, ge=0)
    alignment_duration: int = Field(default=0, ge=0)
    start_delay: int = Field(default=0, ge=0)
    processed_data: int = Field(default=0, ge=0)
    persisted_data: int = Field(default=0, ge=0)
    unaligned: bool = False


def _check_segments(segments: list[ChannelSegment], channel_state: BlobRef | BlobDigest | None) -> None:
    if segments and channel_state is None:
        raise ValueError("channel_segments given without a channel_state blob")
    if channel_state is not None:
        for s in segments:
            if s.offset + s.length > channel_state.size:
                raise ValueError(
                    f"segment of channel {s.channel!r} ends at {s.offset + s.length}, "
                    f"past the channel-state blob's size {channel_state.size}"
                )


class _AckFields(_Model):
    """What an ack says besides where its blobs are."""

    attempt: int
    vertex: str
    subtask_index: int = Field(ge=0)
    channel_segments: list[ChannelSegment] = Field(default_factory=list)
    source_offsets: dict[str, Any] | None = None
    key_group_start: int | None = None
    key_group_end: int | None = None
    metrics: AckMetrics = Field(default_factory=AckMetrics)

    @model_validator(mode="after")
    def _segments_need_blob(self) -> _AckFields:
        _check_segments(self.channel_segments, getattr(self, "channel_state", None))
        return self


class SubtaskAck(_AckFields):
    operator_state: BlobRef | None = None
    channel_state: BlobRef | None = None


class BlobDigest(_Model):
    """A blob that travels in the same request: its sha256 (verified before it is stored) and size."""

    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$", description="Hex sha256 of the part's bytes.")
    size: int = Field(ge=0)


class SubtaskReport(_AckFields):
    """A subtask's ack together with its state blobs, sent as one ``multipart/form-data`` request: this JSON as
    the ``ack`` field and the blobs as the ``operator_state`` and ``channel_state`` file parts."""

    operator_state: BlobDigest | None = None
    channel_state: BlobDigest | None = None

    def to_ack(self, operator_state: BlobRef | None, channel_state: BlobRef | None) -> SubtaskAck:
        """The ack this report makes once its blobs are stored."""
        fields = self.model_dump(exclude={"operator_state", "channel_state"})
        return SubtaskAck(**fields, operator_state=operator_state, channel_state=channel_state)


class AckBatch(_Model):
    acks: list[SubtaskAck] = Field(min_length=1, max_length=10_000)


class AckResult(_Model):
    checkpoint_id: int
    vertex: str
    subtask_index: int
    status: CheckpointStatus
    num_acknowledged_subtasks: int
    num_subtasks: int
    duplicate: bool = Field(description="The same ack had been recorded before; nothing changed.")


class AckBatchItem(_Model):
    vertex: str
    subtask_index: int
    ok: bool
    status_code: int
    result: AckResult | None = None
    error: str | None = None


class AckBatchResult(_Model):
    items: list[AckBatchItem]


class Decline(_Model):
    attempt: int
    vertex: str
    subtask_index: int = Field(ge=0)
    reason: str = Field(max_length=2000)


class ExternalCheckpoint(_Model):
    """A checkpoint that an engine took on its own and reports once complete (a Structured Streaming micro-batch).

    Its id is the engine's (the batch id): ids must grow, and a restarted query continues them.
    """

    id: int = Field(ge=0, description="The engine's checkpoint id, e.g. the micro-batch id.")
    attempt: int | None = Field(default=None, description="The attempt that took it; default: the current one.")
    trigger_timestamp: int = Field(ge=0, description="When it started (ms since the epoch).")
    completed_timestamp: int = Field(ge=0, description="When it was durable (ms since the epoch).")
    state_size: int = Field(default=0, ge=0)
    processed_data: int = Field(default=0, ge=0, description="Input processed, bytes or rows as the engine counts.")
    persisted_data: int = Field(default=0, ge=0)
    alignment_duration: int | None = Field(default=None, ge=0)
    source_offsets: dict[str, Any] | None = None
    metrics: dict[str, Any] = Field(default_factory=dict, description="Engine-specific figures, kept as they are.")

    @model_validator(mode="after")
    def _order(self) -> ExternalCheckpoint:
        if self.completed_timestamp < self.trigger_timestamp:
            raise ValueError(
                f"completed_timestamp {self.completed_timestamp} is before trigger_timestamp {self.trigger_timestamp}"
            )
        return self


class SubtaskStats(_Model):
    vertex: str
    subtask_index: int
    ack_timestamp: int
    end_to_end_duration: int
    state_size: int
    sync_duration: int
    async_duration: int
    alignment_duration: int
    start_delay: int
    processed_data: int
    persisted_data: int
    unaligned: bool
    operator_state: BlobRef | None = None
    channel_state: BlobRef | None = None
    source_offsets: dict[str, Any] | None = None


class CheckpointDetail(Checkpoint):
    subtasks: list[SubtaskStats]
    pending_subtasks: list[str] = Field(description="'vertex[index]' of the subtasks that have not acked.")


class ChannelStateEntry(_Model):
    vertex: str
    subtask_index: int
    blob_id: str
    segments: list[ChannelSegment]


class ChannelStateManifest(_Model):
    job_id: int
    checkpoint_id: int
    entries: list[ChannelStateEntry]


class MinMaxAvg(_Model):
    min: float | None = None
    max: float | None = None
    avg: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None


class CheckpointCounts(_Model):
    total: int
    in_progress: int
    completed: int
    failed: int
    savepoints: int


class CheckpointSummary(_Model):
    end_to_end_duration: MinMaxAvg
    state_size: MinMaxAvg
    persisted_data: MinMaxAvg
    processed_data: MinMaxAvg
    alignment_duration: MinMaxAvg


class LatestCheckpoints(_Model):
    completed: Checkpoint | None = None
    savepoint: Checkpoint | None = None
    failed: Checkpoint | None = None


class CheckpointStatistics(_Model):
    counts: CheckpointCounts
    summary: CheckpointSummary
    latest: LatestCheckpoints
    history: list[Checkpoint]


# --------------------------------------------------------------------------- events, errors, health


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


class ErrorBody(_Model):
    code: str = Field(description="A stable machine-readable code, e.g. 'not_found', 'conflict'.")
    message: str = Field(description="What was wrong and what to do.")
    details: Any | None = None


class ErrorResponse(_Model):
    error: ErrorBody


class Health(_Model):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)


class BlobInfo(_Model):
    blob_id: str
    job_id: int
    checkpoint_id: int
    vertex: str
    subtask_index: int
    kind: Literal["operator", "channel"]
    sha256: str
    size: int
    created_at: int
