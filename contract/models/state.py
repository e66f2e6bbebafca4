"""Where a checkpoint's state lives: object keys under a checkpoint's prefix, channel segments and their parts,
blob references, write targets, what a subtask wrote, where a restoring subtask reads, and blobs found corrupt."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    model_validator,
)

from contract.models.base import (
    MAX_ATTEMPT,
    MAX_FIGURE,
    MAX_PARALLELISM,
    NAME_PATTERN,
    _Model,
)
from contract.models.graph import Partitioning

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
    codec: Literal["lz4", "zstd"] | None = Field(
        default=None,
        description="The codec each buffer of the segment is compressed with (lz4: the LZ4 frame format); offset, "
        "length and parts count the compressed bytes. null: the buffers are stored as they travelled.",
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
