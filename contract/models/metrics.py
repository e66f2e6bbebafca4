"""Live metrics of running subtasks: what a subtask reports over its last window, and the per-vertex view of
them."""

from __future__ import annotations

from typing import ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

from contract.models.base import (
    MAX_FIGURE,
    MAX_ID,
    MAX_PARALLELISM,
    NAME_PATTERN,
    _Model,
)


class SplitLiveMetrics(BaseModel):
    """One split (a Kafka partition, a file, a stream) of a source subtask, as the subtask last read it."""

    model_config = ConfigDict(extra="ignore")

    split: str = Field(max_length=512, description="The split's id, e.g. 'orders-3' (topic-partition) or a file.")
    position: str | None = Field(
        default=None,
        max_length=64,
        description="Where the subtask stands in the split, shortened for reading (a Kafka offset, a byte or row "
        "position); null before its first read.",
    )
    lag: int | None = Field(
        default=None,
        ge=0,
        le=2**62,
        description="How far the position trails the split's end: records behind a Kafka partition's high "
        "watermark, bytes or rows left of a file, 0 once the split ended; null when the source does not know.",
    )


class SubtaskRecovery(BaseModel):
    """How far a subtask restored from a checkpoint has come: the in-flight data it restored and has replayed, and
    when its replay finished. A restored subtask sends it with every metrics report of its attempt."""

    model_config = ConfigDict(extra="ignore")

    restored_checkpoint_id: int | None = Field(default=None, ge=1, le=MAX_ID, description="The checkpoint restored.")
    restored_bytes: int | None = Field(
        default=None,
        ge=0,
        le=2**62,
        description="Bytes of channel state (input and output) the subtask queued to replay: what replayed_bytes "
        "counts up to. After a rescale it is what this subtask kept of the segments it read.",
    )
    restored_buffers: int | None = Field(
        default=None, ge=0, le=2**62, description="Buffers of channel state queued to replay (records are not counted)."
    )
    replayed_bytes: int | None = Field(
        default=None,
        ge=0,
        le=2**62,
        description="Of restored_bytes, those replayed so far: recovered input the loop took, recovered output sent.",
    )
    replay_finished_at: int | None = Field(
        default=None,
        ge=0,
        le=MAX_FIGURE,
        description="When the subtask's replay finished (ms since the epoch): its recovered input taken, every "
        "upstream's re-sent output received, its recovered output sent. Null while it replays.",
    )
    restore_ms: int | None = Field(
        default=None,
        ge=0,
        le=MAX_FIGURE,
        description="Time the task spent fetching and loading its state (operator and channel state) before its "
        "loop ran.",
    )
    started_at: int | None = Field(
        default=None, ge=0, le=MAX_FIGURE, description="When the subtask's task started (ms since the epoch)."
    )
    loop_started_at: int | None = Field(
        default=None,
        ge=0,
        le=MAX_FIGURE,
        description="When the subtask's loop started running, after its restore and connecting its channels (ms "
        "since the epoch).",
    )


class SubtaskMetrics(BaseModel):
    """What a running subtask measured over its last window. Every field is optional, and fields this coordinator
    does not know are ignored, so a runtime can report more without breaking an older one."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"dependentRequired": {"watermark_lag_ms": ["watermark"]}})
    RULES: ClassVar[tuple[str, ...]] = ("metrics.watermark_lag_ms (non-null) comes with a non-null metrics.watermark.",)

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
    splits: list[SplitLiveMetrics] | None = Field(
        default=None,
        max_length=100,
        description="A source subtask's splits (at most 100, by id) with their positions and lag; null for other "
        "subtasks.",
    )
    splits_more: int | None = Field(
        default=None, ge=0, le=2**62, description="How many more splits the subtask reads than `splits` lists."
    )
    recovery: SubtaskRecovery | None = Field(
        default=None,
        description="A subtask restored from a checkpoint: what it restored and its replay; null after a fresh "
        "start.",
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


class SubtaskMetricsBatchItem(_Model):
    """One subtask's report in a batch: who measured it, when, and what."""

    vertex: str = Field(pattern=NAME_PATTERN)
    subtask_index: int = Field(ge=0, lt=MAX_PARALLELISM)
    timestamp: int = Field(ge=0, le=MAX_FIGURE, description="When the subtask measured them (ms since the epoch).")
    metrics: SubtaskMetrics


class SubtaskMetricsBatch(_Model):
    """The latest reports of several subtasks of one attempt, as a host's relay gathers them: each keeps its own
    subtask and measuring time, so batching changes neither whose figures they are nor when they were taken."""

    reports: list[SubtaskMetricsBatchItem] = Field(min_length=1, max_length=10_000)


class SubtaskMetricsBatchOutcome(_Model):
    vertex: str
    subtask_index: int
    status_code: int = Field(description="204 when kept (or older than the kept one), else the error's status.")
    error: str | None = None


class SubtaskMetricsBatchResult(_Model):
    items: list[SubtaskMetricsBatchOutcome] = Field(description="One per report, in the request's order.")


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
    replaying: int = Field(
        default=0, description="Reporting subtasks restored from a checkpoint whose replay has not finished."
    )
    restored_bytes: int | None = Field(
        default=None, description="Sum of the reporting subtasks' recovery.restored_bytes (null: none restored)."
    )
    replayed_bytes: int | None = Field(
        default=None, description="Sum of the reporting subtasks' recovery.replayed_bytes (null: none restored)."
    )
    subtasks: list[SubtaskLiveMetrics]


class JobLiveMetrics(_Model):
    job_id: int
    attempt: int | None
    now: int = Field(description="The coordinator's clock when it answered.")
    max_age: int = Field(description="Metrics older than this (ms) are left out: their subtask stopped reporting.")
    vertices: list[VertexLiveMetrics]
