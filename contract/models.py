"""The wire contract's models: the request and response bodies of the coordinator's API, shared by the coordinator,
the SDK and the runtime.

Field names of the statistics follow Flink's checkpoint REST API (``end_to_end_duration``,
``state_size``, ``persisted_data``, ``processed_data``, ``num_acknowledged_subtasks`` ...).
Durations are milliseconds, timestamps are milliseconds since the epoch, sizes are bytes.
"""

from __future__ import annotations

import math
import re
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

NAME_PATTERN = r"^[A-Za-z0-9_.\-]{1,128}$"
NAME_RE = re.compile(NAME_PATTERN)

# What the database's columns hold, and sane ranges for what the API takes.
MAX_ID = 2**63 - 1  # job, checkpoint and event ids, offsets (64-bit columns)
MAX_ATTEMPT = 2**31 - 1  # attempt numbers (32-bit columns)
MAX_PARALLELISM = 32768  # key groups per vertex, so subtask indices and key groups are below this
MAX_FIGURE = 2**46  # a subtask's byte counts, record counts, durations (ms) and timestamps (ms since the epoch)
MAX_CONFIG_MS = 7 * 24 * 3600 * 1000  # a week: the longest interval, timeout, pause or alignment timeout


def _range(lo: int, hi: int) -> dict[str, Any]:
    """A range the JSON schema shows, checked by a validator that can say it in the field's own words."""
    return {"json_schema_extra": {"minimum": lo, "maximum": hi}}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _non_finite(value: Any, where: str) -> str | None:
    """Where in a JSON value a number is NaN or infinite (what parsers accept beyond JSON), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _non_finite(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def _finite_only(value: dict[str, Any]) -> dict[str, Any]:
    where = _non_finite(value, "")
    if where is not None:
        raise ValueError(
            f"{where} is not a finite number (NaN and Infinity are not JSON and cannot be stored as it); "
            "send a number, a string or null"
        )
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(_finite_only)]
"""A JSON object kept as it is (source offsets, an engine's figures): only JSON values, no NaN or Infinity."""


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
    unaligned_last_barrier = "unaligned_last_barrier"
    """Barriers overtake input queues; a subtask snapshots when its last barrier arrived and forwards in band, so it
    persists the inputs its barriers overtook and none of its outputs (for operators with many outputs per input)."""
    adaptive = "adaptive"
    """Chosen by the coordinator per checkpoint: aligned (with an alignment budget) or unaligned, from recent
    alignment times, backpressure and persisted bytes; a barrier carries the chosen policy, never this one."""


class Vertex(_Model):
    id: str = Field(
        json_schema_extra={"pattern": NAME_PATTERN},
        description="Operator id, unique in the job ([A-Za-z0-9_.-], at most 128 characters).",
    )
    name: str | None = Field(default=None, max_length=256, description="Display name; defaults to the id.")
    parallelism: int = Field(
        description="Number of subtasks (at least 1, at most max_parallelism).", **_range(1, MAX_PARALLELISM)
    )
    max_parallelism: int = Field(
        default=128,
        description="Number of key groups; the upper bound for rescaling (at least parallelism).",
        **_range(1, MAX_PARALLELISM),
    )
    kind: Literal["source", "operator", "sink"] = "operator"
    keyed: bool = Field(default=False, description="Whether the vertex keeps keyed state (addressed by key group).")

    @model_validator(mode="after")
    def _bounds(self) -> Vertex:
        if not NAME_RE.match(self.id):
            raise ValueError(f"vertex id {self.id!r} must be 1-128 characters of letters, digits, '_', '.', '-'")
        if not 1 <= self.parallelism <= MAX_PARALLELISM:
            raise ValueError(
                f"vertex {self.id!r} has parallelism {self.parallelism}; it must be at least 1 and at most "
                f"{MAX_PARALLELISM}"
            )
        if not 1 <= self.max_parallelism <= MAX_PARALLELISM:
            raise ValueError(
                f"vertex {self.id!r} has max_parallelism {self.max_parallelism}; the limit is {MAX_PARALLELISM}"
            )
        return self


class Edge(_Model):
    source: str = Field(pattern=NAME_PATTERN, description="Upstream vertex id.")
    target: str = Field(pattern=NAME_PATTERN, description="Downstream vertex id.")
    partitioning: Partitioning = Partitioning.forward


class Graph(_Model):
    vertices: list[Vertex] = Field(min_length=1, max_length=1000)
    edges: list[Edge] = Field(default_factory=list, max_length=10_000)


CONFIG_RANGES: dict[str, tuple[int, int, str]] = {
    "interval": (1, MAX_CONFIG_MS, "must be positive (ms) or null"),
    "timeout": (1, MAX_CONFIG_MS, "must be positive (ms)"),
    "min_pause": (0, MAX_CONFIG_MS, "must not be negative (ms)"),
    "max_concurrent": (1, 1000, "must be at least 1"),
    "alignment_timeout": (0, MAX_CONFIG_MS - 1, "must not be negative (ms)"),
    "tolerable_failures": (0, 1_000_000, "must not be negative"),
    "retained": (1, 1000, "must be at least 1"),
    "max_inflight_bytes_per_subtask": (0, MAX_FIGURE, "must not be negative (bytes) or null"),
    "max_inflight_bytes": (0, MAX_FIGURE, "must not be negative (bytes) or null"),
}


OverInflightBudget = Literal["align", "abort"]


class CheckpointConfig(_Model):
    interval: int | None = Field(
        default=None,
        description="Periodic trigger interval in ms; null disables periodic checkpoints.",
        **_range(*CONFIG_RANGES["interval"][:2]),
    )
    timeout: int = Field(
        default=600_000,
        description="A checkpoint pending longer than this (ms) is aborted.",
        **_range(*CONFIG_RANGES["timeout"][:2]),
    )
    min_pause: int = Field(
        default=0,
        description="Minimum pause (ms) between the end of one checkpoint and the next trigger.",
        **_range(*CONFIG_RANGES["min_pause"][:2]),
    )
    max_concurrent: int = Field(
        default=1, description="Maximum number of pending checkpoints.", **_range(*CONFIG_RANGES["max_concurrent"][:2])
    )
    policy: BarrierPolicy = BarrierPolicy.aligned_then_unaligned
    alignment_timeout: int | None = Field(
        default=None,
        description="For aligned_then_unaligned: ms after the trigger at which alignment switches to unaligned "
        "(below timeout). For adaptive: the alignment budget (default 1000 ms, at most half the timeout).",
        **_range(*CONFIG_RANGES["alignment_timeout"][:2]),
    )
    tolerable_failures: int = Field(
        default=0,
        description="Consecutive failed checkpoints tolerated before the job is marked failing.",
        **_range(*CONFIG_RANGES["tolerable_failures"][:2]),
    )
    retained: int = Field(
        default=1,
        description="Completed checkpoints kept (savepoints are never collected).",
        **_range(*CONFIG_RANGES["retained"][:2]),
    )
    incremental_channel_state: bool = Field(
        default=False,
        description="Unaligned checkpoints reference in-flight buffers that the previous completed checkpoint "
        "already persisted instead of writing them again (state written straight into the blob store only; "
        "savepoints always write everything).",
    )
    max_inflight_bytes_per_subtask: int | None = Field(
        default=None,
        description="In-flight budget: the most bytes of in-flight data one subtask persists for one unaligned "
        "checkpoint; a subtask that would pass it takes that checkpoint aligned (see over_inflight_budget). "
        "Null: no limit.",
        **_range(*CONFIG_RANGES["max_inflight_bytes_per_subtask"][:2]),
    )
    max_inflight_bytes: int | None = Field(
        default=None,
        description="In-flight budget of the whole job per checkpoint, shared equally by its subtasks (each gets "
        "the smaller of this divided by the number of subtasks and max_inflight_bytes_per_subtask). Null: no limit.",
        **_range(*CONFIG_RANGES["max_inflight_bytes"][:2]),
    )
    over_inflight_budget: OverInflightBudget = Field(
        default="align",
        description="What a subtask does when the in-flight data it would persist passes its budget: 'align' "
        "(takes the checkpoint aligned, persisting nothing) or 'abort' (declines the checkpoint).",
    )

    @field_validator(*CONFIG_RANGES, mode="after")
    @classmethod
    def _in_range(cls, v: int | None, info) -> int | None:
        lo, hi, low_message = CONFIG_RANGES[info.field_name]
        if v is not None and v < lo:
            raise ValueError(f"checkpoint.{info.field_name} {low_message}, got {v}")
        if v is not None and v > hi:
            raise ValueError(f"checkpoint.{info.field_name} is at most {hi}, got {v}")
        return v


LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=128)]
LabelValue = Annotated[str, StringConstraints(max_length=1024)]


class JobCreate(_Model):
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
    num_failed: int = Field(default=0, description="Aborted checkpoints, whatever the reason (see num_interrupted).")
    num_in_progress: int = 0
    num_interrupted: int = Field(
        default=0,
        description="Of the aborted checkpoints, those that did not fail: the job ended or was cancelled, a new "
        "attempt started, or a newer checkpoint subsumed them.",
    )
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


# --------------------------------------------------------------------------- attempts and restore plans


class AttemptCreate(_Model):
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

    @property
    def restore_from(self) -> int | Literal["latest"] | None:
        """What to restore: a checkpoint id, 'latest', or None (a fresh start)."""
        if self.restore_from_checkpoint is not None:
            return self.restore_from_checkpoint
        return "latest" if self.restore_latest else None

    @classmethod
    def restoring(cls, restore_from: int | Literal["latest"] | None, **fields: Any) -> AttemptCreate:
        """The body for `restore_from` as the SDK takes it: a checkpoint id, 'latest' or None."""
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


STATE_KEY_PATTERN = r"^job-[0-9]{1,19}/cp-[0-9]{12,19}/[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,199}$"
"""Keys of objects subtasks write: under their job's and checkpoint's prefix (``job-7/cp-000000000012/``, the
checkpoint id zero-padded to at least 12 digits), a name of letters, digits, '_', '.', '-' that does not start with
a dot (so never '.' or '..')."""


class SegmentPart(_Model):
    """A run of whole buffers of a segment: in the ack's own channel state, or in the channel state of an object an
    earlier completed checkpoint of the same job wrote (incremental channel state: a buffer still in flight is
    referenced, not written again)."""

    key: str | None = Field(
        default=None,
        pattern=STATE_KEY_PATTERN,
        description="An object of an earlier checkpoint of the same job whose channel state holds these bytes; "
        "null: this ack's own channel state.",
    )
    offset: int = Field(ge=0, le=MAX_FIGURE, description="Where the bytes start in that object's channel state.")
    length: int = Field(ge=1, le=MAX_FIGURE)
    blob_id: str | None = Field(
        default=None,
        description="Restore plans only: the blob holding the part (its location is in the plan's blobs); the "
        "coordinator fills it in.",
    )


class ChannelSegment(_Model):
    """One channel's bytes inside a subtask's channel-state blob.

    With ``parts`` the segment's bytes are its parts' bytes in order (``length`` is their total and ``offset`` the
    first own part's offset, 0 if none); without, they are ``length`` bytes at ``offset`` of the own channel state.
    """

    channel: str = Field(
        max_length=512, description="Channel name, e.g. 'in:map[0]->reduce[1]' or 'out:map[0]->reduce[1]'."
    )
    direction: Literal["input", "output"]
    offset: int = Field(ge=0, le=MAX_FIGURE)
    length: int = Field(ge=0, le=MAX_FIGURE)
    buffer_count: int = Field(ge=0, le=MAX_FIGURE)
    record_count: int = Field(ge=0, le=MAX_FIGURE)
    peer_vertex: str | None = Field(default=None, max_length=128)
    peer_subtask: int | None = Field(default=None, ge=0, lt=MAX_PARALLELISM)
    partitioning: Partitioning | None = None
    parts: list[SegmentPart] | None = Field(
        default=None,
        max_length=100_000,
        description="Incremental channel state: the segment's bytes as runs of this ack's own channel state and of "
        "earlier objects of the job; null: the segment is one run at offset.",
    )

    @model_validator(mode="after")
    def _parts_add_up(self) -> ChannelSegment:
        if self.parts is not None and sum(p.length for p in self.parts) != self.length:
            raise ValueError(
                f"segment of channel {self.channel!r}: its parts hold {sum(p.length for p in self.parts)} bytes, "
                f"its length says {self.length}"
            )
        return self

    def own_runs(self) -> list[tuple[int, int]]:
        """``(offset, length)`` of each run of the segment in its own ack's channel state."""
        if self.parts is None:
            return [(self.offset, self.length)]
        return [(p.offset, p.length) for p in self.parts if p.key is None]

    def references(self) -> list[SegmentPart]:
        """The parts that lie in earlier objects."""
        return [p for p in self.parts or [] if p.key is not None]


class BlobRef(_Model):
    blob_id: str = Field(pattern=r"^[0-9a-f]{32}$", description="A blob id the coordinator issued.")
    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")
    size: int = Field(ge=0, le=MAX_FIGURE)


def state_prefix(job_id: int, checkpoint_id: int) -> str:
    """The key prefix of a checkpoint's objects in the blob store: ``job-7/cp-000000000012/``."""
    return f"job-{int(job_id)}/cp-{int(checkpoint_id):012d}/"


class WriteTarget(_Model):
    """Where the subtasks write one checkpoint's state straight into the blob store, scoped to that checkpoint: the
    key prefix they may write under, and how to write there.

    A subtask writes one object named ``prefix + name`` (``name``: letters, digits, '_', '.', '-', not starting
    with a dot; e.g. ``agg-0-a1.state``) and acks it as ``WrittenState.key``:

    - file:// stores (no ``fields``): ``url`` is the store's root directory, ending in '/', which the executors
      share; the object is the file at ``url + prefix + name`` (create the prefix's directories).
    - s3:// stores: ``url`` and ``fields`` are a presigned POST: send ``fields`` as form fields, with
      ``${filename}`` in ``fields["key"]`` replaced by the name, then the object's bytes as the ``file`` part.
      Its policy allows keys under the prefix only, at most the coordinator's OVERTAKE_MAX_BLOB_SIZE bytes, until
      ``expires_at``.
    """

    prefix: str = Field(max_length=512, description="The checkpoint's key prefix, e.g. 'job-7/cp-000000000012/'.")
    url: str = Field(
        max_length=8192,
        description="file:// stores: the store's root directory, shared by the executors, ending in '/' (write "
        "url + prefix + name); s3: the presigned POST's URL.",
    )
    fields: dict[str, str] = Field(
        default_factory=dict,
        description="s3: the presigned POST's form fields; `key` ends in '${filename}' (replace it by the "
        "object's name); its policy allows keys under the prefix only.",
    )
    expires_at: int | None = Field(
        default=None, description="When the grant ends (ms since the epoch): the checkpoint's timeout."
    )
    incremental: bool = Field(
        default=False,
        description="Channel segments may reference ranges of objects earlier completed checkpoints of the job "
        "wrote (SegmentPart.key) instead of writing those buffers again (checkpoint.incremental_channel_state).",
    )


class WrittenState(_Model):
    """A subtask's state written straight into the blob store: one object under its checkpoint's prefix holding the
    operator state, then the channel state (whose segments' offsets count from its start)."""

    key: str = Field(pattern=STATE_KEY_PATTERN, description="The object's key, under the checkpoint's prefix.")
    size: int = Field(ge=0, le=MAX_FIGURE, description="The object's size in bytes.")
    operator_size: int = Field(ge=0, le=MAX_FIGURE, description="Bytes of operator state at its start.")
    operator_sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")
    channel_sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")

    @property
    def channel_size(self) -> int:
        return self.size - self.operator_size

    @model_validator(mode="after")
    def _parts(self) -> WrittenState:
        if self.operator_size > self.size:
            raise ValueError(f"operator_size {self.operator_size} is past the object's size {self.size}")
        if (self.operator_size > 0) != (self.operator_sha256 is not None):
            raise ValueError("operator_sha256 is given exactly when there is operator state (operator_size > 0)")
        if (self.channel_size > 0) != (self.channel_sha256 is not None):
            raise ValueError("channel_sha256 is given exactly when there is channel state (size > operator_size)")
        return self


class BlobLocation(_Model):
    """Where a restoring subtask reads a blob: an object's URL (a file:// path the executors share, or a presigned
    GET) and where the blob starts in it; without a URL, through the coordinator (GET .../blobs/{blob_id}). The
    subtask verifies the blob's sha256 as it reads it.

    The blob is bytes ``offset`` to ``offset + size - 1`` of the object at ``url`` (an HTTP ``Range`` for a
    presigned GET); a channel segment of it starts at ``offset + segment.offset``."""

    blob_id: str
    sha256: str
    size: int
    url: str | None = Field(
        default=None,
        description="The object holding the blob: a file:// URL, or a presigned GET URL; null: read it through the "
        "coordinator.",
    )
    offset: int = Field(default=0, description="Where the blob starts in the object.")
    expires_at: int | None = Field(default=None, description="When a presigned URL stops working (ms since the epoch).")


class CorruptBlob(_Model):
    """A restoring subtask read a blob whose bytes do not match its sha256: the blob is never replayed, and the
    next attempt's restore plan falls back past its checkpoint, naming it."""

    attempt: int = Field(ge=1, le=MAX_ATTEMPT)
    vertex: str = Field(pattern=NAME_PATTERN)
    subtask_index: int = Field(ge=0, lt=MAX_PARALLELISM)
    reason: str = Field(max_length=2000)


class RestoreState(_Model):
    """A slice of operator state to load: a blob, and the key-group range of it that this subtask owns."""

    blob_id: str
    sha256: str
    size: int
    from_subtask: int
    key_group_start: int | None = None
    key_group_end: int | None = None


class RestoreSegment(ChannelSegment):
    blob_id: str | None = Field(
        description="The blob of the subtask's own channel state; null when every part of the segment lies in "
        "blobs of earlier checkpoints (each part names its blob)."
    )
    from_subtask: int
    key_group_start: int | None = Field(
        default=None, description="Hash edges: the first key group of the subtask that persisted the segment."
    )
    key_group_end: int | None = Field(
        default=None, description="Hash edges: the last key group of the subtask that persisted the segment."
    )


class SourcePosition(_Model):
    """Where an old source subtask was when the checkpoint was taken."""

    from_subtask: int
    offsets: dict[str, Any]


class SubtaskRestore(_Model):
    vertex: str
    subtask_index: int
    key_group_start: int | None = None
    key_group_end: int | None = None
    operator_state: list[RestoreState] = Field(default_factory=list)
    output_channel_state: list[RestoreSegment] = Field(
        default_factory=list, description="Output channel state this subtask re-sends (before any new output)."
    )
    input_channel_state: list[RestoreSegment] = Field(
        default_factory=list,
        description="Input channel state this subtask processes first; after a rescale, segments of hash edges "
        "are filtered by the subtask's key groups.",
    )
    source_offsets: dict[str, Any] | None = Field(
        default=None, description="A source subtask's own offsets at the checkpoint (same parallelism)."
    )
    source_positions: list[SourcePosition] = Field(
        default_factory=list,
        description="A rescaled source vertex: every old source subtask's offsets; each new subtask takes the "
        "splits (partitions, files, streams) it owns at the new parallelism, so every input is read once.",
    )
    blobs: list[BlobLocation] = Field(
        default_factory=list, description="Where to read each blob the operator and channel state above name."
    )


class VertexRescale(_Model):
    """A vertex whose parallelism differs from the checkpoint's."""

    vertex: str
    old_parallelism: int
    new_parallelism: int
    channel_state_bytes: int = Field(
        description="Bytes of in-flight data redistributed for it: its input channel state and its upstreams' "
        "output channel state towards it."
    )


class PlanFallback(_Model):
    checkpoint_id: int
    reason: str


class RestorePlan(_Model):
    job_id: int
    checkpoint_id: int | None = Field(description="The checkpoint restored, or null for a fresh start.")
    is_savepoint: bool = False
    requested_checkpoint: int | None = Field(default=None, description="The checkpoint that was asked for, if one.")
    requested_latest: bool = Field(default=False, description="The latest completed checkpoint was asked for.")
    fallbacks: list[PlanFallback] = Field(
        default_factory=list, description="Checkpoints passed over because a blob was missing or corrupt."
    )
    rescaled: list[VertexRescale] = Field(
        default_factory=list, description="Vertices restored with another parallelism than the checkpoint's."
    )
    subtasks: list[SubtaskRestore] = Field(default_factory=list)


class AttemptInfo(_Model):
    """One attempt of a job as it happened: when it ran, what it restored, what it passed over and rescaled."""

    attempt: int
    started_at: int
    ended_at: int | None = Field(description="When a newer attempt started or the job ended (null: current).")
    restored_checkpoint_id: int | None = Field(description="The checkpoint it restored (null: a fresh start).")
    restored_is_savepoint: bool = False
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


class AttemptPage(_Model):
    items: list[AttemptInfo] = Field(description="Newest first.")
    total: int


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


class PolicyDecision(_Model):
    """What the adaptive policy chose for one checkpoint, and why."""

    requested: BarrierPolicy = Field(description="The policy asked for (adaptive).")
    chosen: BarrierPolicy = Field(description="What the checkpoint's barriers carried: aligned_then_unaligned (with "
                                  "the budget as alignment timeout) or unaligned.")
    reason: str = Field(description="The rule that decided, with the figures it saw.")
    budget: int = Field(description="The alignment budget (ms).")
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


class AckMetrics(_Model):
    sync_duration: int = Field(default=0, ge=0, le=MAX_FIGURE)
    async_duration: int = Field(default=0, ge=0, le=MAX_FIGURE)
    alignment_duration: int = Field(default=0, ge=0, le=MAX_FIGURE)
    start_delay: int = Field(default=0, ge=0, le=MAX_FIGURE)
    processed_data: int = Field(default=0, ge=0, le=MAX_FIGURE)
    persisted_data: int = Field(default=0, ge=0, le=MAX_FIGURE)
    unaligned: bool = False


def _check_segments(segments: list[ChannelSegment], channel_size: int | None) -> None:
    if channel_size is None and any(s.parts is None for s in segments):
        raise ValueError("channel_segments given without channel state")
    runs: list[tuple[int, int, str]] = []
    for s in segments:
        for offset, length in s.own_runs():
            if length and (channel_size is None or offset + length > channel_size):
                raise ValueError(
                    f"segment of channel {s.channel!r} ends at {offset + length}, "
                    f"past the channel state's size {channel_size or 0}"
                )
            if length:
                runs.append((offset, offset + length, s.channel))
        if any(p.blob_id is not None for p in s.parts or []):
            raise ValueError(f"segment of channel {s.channel!r}: blob_id of a part is the coordinator's to fill in")
    runs.sort()
    for (_, end, first), (start, _, second) in zip(runs, runs[1:], strict=False):
        if start < end:  # a restore would replay those bytes twice
            raise ValueError(
                f"segments of channels {first!r} and {second!r} both hold bytes {start}..{end - 1} of the channel "
                "state; each byte belongs to one segment"
            )


class _AckFields(_Model):
    """What an ack says besides where its blobs are."""

    attempt: int = Field(ge=1, le=MAX_ATTEMPT)
    vertex: str = Field(pattern=NAME_PATTERN)
    subtask_index: int = Field(ge=0, lt=MAX_PARALLELISM)
    channel_segments: list[ChannelSegment] = Field(default_factory=list, max_length=100_000)
    source_offsets: JsonObject | None = None
    key_group_start: int | None = Field(default=None, ge=0, lt=MAX_PARALLELISM)
    key_group_end: int | None = Field(default=None, ge=0, lt=MAX_PARALLELISM)
    metrics: AckMetrics = Field(default_factory=AckMetrics)

    def _channel_size(self) -> int | None:
        channel = getattr(self, "channel_state", None)
        return channel.size if channel is not None else None

    @model_validator(mode="after")
    def _segments_need_blob(self) -> _AckFields:
        _check_segments(self.channel_segments, self._channel_size())
        return self

    @model_validator(mode="after")
    def _key_groups_in_order(self) -> _AckFields:
        start, end = self.key_group_start, self.key_group_end
        if start is not None and end is not None and start > end:
            raise ValueError(
                f"key_group_start {start} is after key_group_end {end}: the range is from its first key group to "
                "its last, both included"
            )
        return self


class SubtaskAck(_AckFields):
    operator_state: BlobRef | None = Field(default=None, description="Operator state uploaded through the coordinator.")
    channel_state: BlobRef | None = Field(default=None, description="Channel state uploaded through the coordinator.")
    written: WrittenState | None = Field(
        default=None,
        description="State the subtask wrote straight into the blob store (instead of operator_state/channel_state).",
    )

    def _channel_size(self) -> int | None:
        if self.written is not None:
            if self.operator_state is not None or self.channel_state is not None:
                raise ValueError("an ack names its state either as written or as uploaded blobs, not both")
            return self.written.channel_size if self.written.channel_size > 0 else None
        return super()._channel_size()


class BlobDigest(_Model):
    """A blob that travels in the same request: its sha256 (verified before it is stored) and size."""

    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$", description="Hex sha256 of the part's bytes.")
    size: int = Field(ge=0, le=MAX_FIGURE)


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
    attempt: int = Field(ge=1, le=MAX_ATTEMPT)
    vertex: str = Field(pattern=NAME_PATTERN)
    subtask_index: int = Field(ge=0, lt=MAX_PARALLELISM)
    reason: str = Field(max_length=2000)


class ExternalCheckpoint(_Model):
    """A checkpoint that an engine took on its own and reports once complete (a Structured Streaming micro-batch).

    Its id is the engine's (the batch id): ids must grow, and a restarted query continues them.
    """

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


class VertexCheckpointSummary(_Model):
    """One vertex's part of a checkpoint: each figure's min/avg/max (and percentiles) across its acked subtasks,
    like Flink's per-operator checkpoint details."""

    vertex: str
    parallelism: int = Field(description="Subtasks of the vertex in the checkpoint's attempt.")
    num_acknowledged_subtasks: int
    num_unaligned: int = Field(description="Acked subtasks that took the checkpoint unaligned.")
    latest_ack_timestamp: int | None
    end_to_end_duration: MinMaxAvg
    state_size: MinMaxAvg
    sync_duration: MinMaxAvg
    async_duration: MinMaxAvg
    alignment_duration: MinMaxAvg
    start_delay: MinMaxAvg
    processed_data: MinMaxAvg
    persisted_data: MinMaxAvg


class CheckpointDetail(Checkpoint):
    subtasks: list[SubtaskStats]
    pending_subtasks: list[str] = Field(
        description="'vertex[index]' of the subtasks that have not acked (only while the checkpoint is pending)."
    )
    vertices: list[VertexCheckpointSummary] = Field(
        default_factory=list, description="Per vertex, in graph order: min/avg/max of each field across subtasks."
    )


class ChannelStateEntry(_Model):
    vertex: str
    subtask_index: int
    blob_id: str | None = Field(
        description="The subtask's channel-state blob; null when its segments only reference earlier checkpoints' "
        "blobs (incremental channel state)."
    )
    segments: list[ChannelSegment]


class ChannelStateManifest(_Model):
    job_id: int
    checkpoint_id: int
    entries: list[ChannelStateEntry]
    deleted: bool = Field(
        default=False,
        description="The checkpoint's blobs were deleted: its segments are listed, their bytes cannot be read.",
    )
    deleted_reason: Literal["retention", "aborted"] | None = Field(
        default=None, description="retention: collected under the job's 'retained'; aborted: the checkpoint aborted."
    )
    deleted_at: int | None = Field(default=None, description="When they were deleted, when the coordinator knows.")


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
    failed: int = Field(description="Aborted checkpoints, whatever the reason (Flink's count).")
    savepoints: int
    interrupted: int = Field(
        default=0,
        description="Of the failed (aborted) ones, those aborted because the job ended or was cancelled, a new "
        "attempt started, or a newer checkpoint completed: not failures of the checkpoint itself.",
    )


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


# --------------------------------------------------------------------------- live metrics of subtasks


class SubtaskMetrics(BaseModel):
    """What a running subtask measured over its last window. Every field is optional, and fields this coordinator
    does not know are ignored, so a runtime can report more without breaking an older one."""

    model_config = ConfigDict(extra="ignore")

    window_ms: int | None = Field(default=None, ge=1, le=MAX_FIGURE, description="The span the rates cover.")
    records_in_per_second: float | None = Field(default=None, ge=0, le=1e12)
    bytes_in_per_second: float | None = Field(default=None, ge=0, le=1e15)
    bytes_out_per_second: float | None = Field(default=None, ge=0, le=1e15)
    backpressure: float | None = Field(
        default=None, ge=0, le=1, description="Share of the window the subtask waited for room in its outputs."
    )
    records_in: int | None = Field(default=None, ge=0, le=2**62, description="Records taken since it started.")
    bytes_in: int | None = Field(default=None, ge=0, le=2**62)
    bytes_out: int | None = Field(default=None, ge=0, le=2**62)
    watermark: int | None = Field(
        default=None,
        ge=-MAX_FIGURE,
        le=MAX_FIGURE,
        description="The subtask's current input watermark (event time, ms since the epoch): the minimum over its "
        "active inputs, or what a source emits. Null before the first watermark, without event time, and once its "
        "input ended.",
    )
    watermark_lag_ms: int | None = Field(
        default=None,
        ge=-2 * MAX_FIGURE,
        le=2 * MAX_FIGURE,
        description="How far the watermark trails the wall clock: the report's timestamp minus the watermark (ms; "
        "negative when event time runs ahead of the clock). Null without a watermark.",
    )
    watermark_idle: bool | None = Field(
        default=None,
        description="Every input of the subtask (every partition of a source) is idle: its watermark holds nothing "
        "downstream back, and the vertex's low watermark leaves it out.",
    )

    @model_validator(mode="after")
    def _lag_needs_a_watermark(self) -> SubtaskMetrics:
        if self.watermark_lag_ms is not None and self.watermark is None:
            raise ValueError(
                f"watermark_lag_ms {self.watermark_lag_ms} comes without a watermark; send the watermark it was "
                "measured against, or neither"
            )
        return self


class SubtaskMetricsReport(_Model):
    """A subtask's latest metrics. Idempotent: the coordinator keeps the newest by ``timestamp`` per subtask."""

    timestamp: int = Field(ge=0, le=MAX_FIGURE, description="When the subtask measured them (ms since the epoch).")
    metrics: SubtaskMetrics


class SubtaskLiveMetrics(_Model):
    vertex: str
    subtask_index: int
    timestamp: int = Field(description="When the subtask measured them.")
    received_at: int = Field(description="When the coordinator received them.")
    metrics: SubtaskMetrics


class VertexLiveMetrics(_Model):
    vertex: str
    parallelism: int
    reporting: int = Field(description="Subtasks whose metrics are recent (see JobLiveMetrics.max_age).")
    records_in_per_second: float | None = Field(description="Sum over the reporting subtasks.")
    bytes_in_per_second: float | None = None
    backpressure_max: float | None = Field(description="The most backpressured subtask's share (Flink's figure).")
    backpressure_avg: float | None = None
    low_watermark: int | None = Field(
        default=None,
        description="The lowest watermark of the reporting subtasks that have one, idle subtasks left out unless all "
        "are idle (ms since the epoch); null when none has one.",
    )
    watermark_lag_max_ms: int | None = Field(
        default=None, description="The largest watermark lag of the subtasks the low watermark is taken over."
    )
    subtasks: list[SubtaskLiveMetrics]


class JobLiveMetrics(_Model):
    job_id: int
    attempt: int | None
    now: int = Field(description="The coordinator's clock when it answered.")
    max_age: int = Field(description="Metrics older than this (ms) are left out: their subtask stopped reporting.")
    vertices: list[VertexLiveMetrics]


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
    deployment: str | None = Field(
        default=None,
        description="The coordinator deployment the event belongs to (its namespace); replicas of one deployment share it.",
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
    corrupt: str | None = Field(
        default=None, description="Why the blob is known to be corrupt (a restoring subtask's report), if it is."
    )
