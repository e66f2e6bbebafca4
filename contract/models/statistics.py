"""A checkpoint's details and a job's checkpoint statistics: per subtask, per vertex (min/avg/max), counts by
state, summaries, the latest ones, and the channel-state manifest."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
)

from contract.models.base import (
    _Model,
)
from contract.models.checkpoints import Checkpoint
from contract.models.state import BlobRef, ChannelSegment


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
    aligned_over_budget: bool = Field(
        default=False, description="Took it aligned because unaligned would have passed the in-flight budget."
    )
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
    num_aligned_over_budget: int = Field(
        default=0, description="Acked subtasks that took it aligned because unaligned would have passed the budget."
    )
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
    never_acked_subtasks: list[str] = Field(
        default_factory=list,
        description="'vertex[index]' of the subtasks that never acked a checkpoint that failed (expired or declined): "
        "for an expired one, the subtasks it waited for.",
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
    failed: int = Field(description="Failed: aborted because they expired or a subtask declined them.")
    not_finished: int = Field(
        default=0,
        description="Not finished, not failures: aborted because the job ended or was cancelled, a new attempt "
        "started, or a newer checkpoint completed first. total = in_progress + completed + failed + not_finished.",
    )
    aborted: int = Field(default=0, description="failed + not_finished (Flink counts all of them as failed).")
    savepoints: int = Field(description="Of all of them, the savepoints.")
    interrupted: int = Field(default=0, description="The same as not_finished (its former name).")


class CheckpointSummary(_Model):
    end_to_end_duration: MinMaxAvg
    state_size: MinMaxAvg
    persisted_data: MinMaxAvg
    processed_data: MinMaxAvg
    alignment_duration: MinMaxAvg


class LatestCheckpoints(_Model):
    completed: Checkpoint | None = None
    savepoint: Checkpoint | None = None
    failed: Checkpoint | None = Field(default=None, description="The latest failed one (expired or declined).")


class CheckpointStatistics(_Model):
    counts: CheckpointCounts
    summary: CheckpointSummary
    latest: LatestCheckpoints
    history: list[Checkpoint]
