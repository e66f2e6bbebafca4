"""A restore plan: per subtask, the operator state, channel state and source positions to restore, and the
checkpoints passed over and vertices rescaled on the way."""

from __future__ import annotations

from typing import Any

from pydantic import (
    Field,
)

from contract.models.base import (
    _Model,
)
from contract.models.state import BlobLocation, ChannelSegment


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
        description="Every old source subtask's offsets (split positions are union state): each new subtask "
        "takes the splits (partitions, files, streams) it owns at its parallelism, so every input is read once.",
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
