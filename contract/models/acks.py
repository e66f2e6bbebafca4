"""Acks and declines: a subtask's report that its part of a checkpoint is durable (alone, in a batch, or with
its state blobs in the same request), and the coordinator's answers."""

from __future__ import annotations

from typing import ClassVar

from pydantic import (
    Field,
    model_validator,
)

from contract.models.base import (
    MAX_ATTEMPT,
    MAX_FIGURE,
    MAX_PARALLELISM,
    NAME_PATTERN,
    JsonObject,
    _Model,
)
from contract.models.checkpoints import CheckpointStatus
from contract.models.state import BlobRef, ChannelSegment, WrittenState


class AckMetrics(_Model):
    sync_duration: int = Field(default=0, ge=0, le=MAX_FIGURE)
    async_duration: int = Field(default=0, ge=0, le=MAX_FIGURE)
    alignment_duration: int = Field(default=0, ge=0, le=MAX_FIGURE)
    start_delay: int = Field(default=0, ge=0, le=MAX_FIGURE)
    processed_data: int = Field(default=0, ge=0, le=MAX_FIGURE)
    persisted_data: int = Field(default=0, ge=0, le=MAX_FIGURE)
    unaligned: bool = Field(default=False, description="The subtask took the checkpoint unaligned.")
    aligned_over_budget: bool = Field(
        default=False,
        description="The subtask took the checkpoint aligned because going unaligned would have passed the "
        "checkpoint's in-flight budget (over_inflight_budget=aligned); `unaligned` is false then.",
    )
    ack_timestamp: int | None = Field(
        default=None, ge=0, le=MAX_FIGURE,
        description="When the subtask's part was durable and it sent its ack (ms since the epoch). An ack relayed "
        "with others keeps its own time; the coordinator records it clamped into [the checkpoint's trigger time, "
        "the ack's arrival] (clocks differ), and the arrival when it is absent.",
    )


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

    RULES: ClassVar[tuple[str, ...]] = (
        "key_group_start is not after key_group_end.",
        "channel_segments come with channel state (channel_state, a written object with channel bytes, or the "
        "channel_state part), unless every segment has parts that all lie in earlier objects.",
        "A segment's own runs (offset, length; or its parts without key) end within the channel state's size and "
        "do not overlap one another; the parts of a segment add up to its length; parts carry no blob_id.",
        "written.operator_size is at most written.size; written.operator_sha256 is given exactly when "
        "operator_size > 0, written.channel_sha256 exactly when size > operator_size.",
    )

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
    RULES: ClassVar[tuple[str, ...]] = (
        *_AckFields.RULES,
        "An ack names its state either as written or as uploaded blobs (operator_state, channel_state), not both.",
    )

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

    RULES: ClassVar[tuple[str, ...]] = (
        *_AckFields.RULES,
        "The parts come in the order ack, operator_state, channel_state; a blob part is sent exactly when the "
        "ack declares it (operator_state, channel_state), with the declared size and sha256.",
    )

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
