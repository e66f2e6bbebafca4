"""SQLAlchemy tables of the coordinator: jobs, attempts, checkpoints, acks, blobs and events."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


# Job ids are 64-bit (the API promises ids up to 2**63 - 1). On SQLite an INTEGER column already holds 64 bits, and
# only an INTEGER PRIMARY KEY is the table's row id (what autoincrement needs), so it stays INTEGER there.
JobId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(JobId, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), index=True)
    kind: Mapped[str] = mapped_column(String(32), default="pipeline")
    status: Mapped[str] = mapped_column(String(16), index=True)
    status_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    graph: Mapped[dict[str, Any]] = mapped_column(JSON)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    num_subtasks: Mapped[int] = mapped_column(Integer)
    current_attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The next checkpoint id: a per-job counter that only ever grows, so ids are never reused.
    next_checkpoint_id: Mapped[int] = mapped_column(BigInteger, default=1)
    # Per-job event sequence; incremented under the job row lock so events commit in order.
    event_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    consecutive_failures: Mapped[int] = mapped_column(Integer, default=0)
    last_trigger_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_completed_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    latest_completed_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)
    # The last failure of the scheduler on this job (cleared by its next successful trigger).
    scheduler_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Periodic checkpoints of the current attempt start no earlier than this (ms): set when the attempt waits for
    # its subtasks to report running (to the fallback deadline), moved to the moment the last one reported.
    periodic_from: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # When every subtask of the current attempt had reported running.
    running_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class RunningSubtaskRow(Base):
    """A subtask of an attempt reported that it runs (once per subtask and attempt)."""

    __tablename__ = "running_subtasks"
    __table_args__ = (ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),)

    job_id: Mapped[int] = mapped_column(JobId, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    vertex: Mapped[str] = mapped_column(String(128), primary_key=True)
    subtask_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    reported_at: Mapped[int] = mapped_column(BigInteger)


class AttemptRow(Base):
    __tablename__ = "attempts"
    __table_args__ = (
        ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        UniqueConstraint("token_hash"),
    )

    job_id: Mapped[int] = mapped_column(JobId, primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64))
    restored_checkpoint_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    started_at: Mapped[int] = mapped_column(BigInteger)
    ended_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class CheckpointRow(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (
        ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        Index("ix_checkpoints_job_id_status", "job_id", "status"),
        Index("ix_checkpoints_status_timeout_at", "status", "timeout_at"),
        # retention, at every completion, reads the job's checkpoints not discarded yet, newest first: the few
        # retained, the pending and the aborted, not the history of discarded ones (up to `checkpoint_history`)
        Index(
            "ix_checkpoints_job_id_id_undiscarded", "job_id", "id",
            postgresql_where=text("discarded IS false"), sqlite_where=text("discarded IS 0"),
        ),
    )

    job_id: Mapped[int] = mapped_column(JobId, primary_key=True)
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    is_savepoint: Mapped[bool] = mapped_column(Boolean, default=False)
    stop_job: Mapped[bool] = mapped_column(Boolean, default=False)
    policy: Mapped[str] = mapped_column(String(32))
    alignment_timeout: Mapped[int | None] = mapped_column(Integer, nullable=True)
    trigger_ts: Mapped[int] = mapped_column(BigInteger)
    timeout_at: Mapped[int] = mapped_column(BigInteger)
    switch_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    switched_ts: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    latest_ack_ts: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    completed_ts: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    num_subtasks: Mapped[int] = mapped_column(Integer)
    num_acked: Mapped[int] = mapped_column(Integer, default=0)
    state_size: Mapped[int] = mapped_column(BigInteger, default=0)
    persisted_data: Mapped[int] = mapped_column(BigInteger, default=0)
    processed_data: Mapped[int] = mapped_column(BigInteger, default=0)
    alignment_duration: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # the longest start delay of its acks (trigger to first barrier): an aligned barrier's wait in front of queues
    start_delay: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    any_unaligned: Mapped[bool] = mapped_column(Boolean, default=False)
    # How its acked subtasks took it: unaligned, and aligned over the in-flight budget (the rest took it aligned).
    num_unaligned: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    num_over_budget: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    failure_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    discarded: Mapped[bool] = mapped_column(Boolean, default=False)
    # Engine-specific figures of a checkpoint reported from outside (Structured Streaming micro-batches).
    details: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # What the adaptive policy chose for it and why (contract.models.PolicyDecision).
    decision: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # What is left to clean under the checkpoint's prefix in the blob store, and from when: "prefix" (everything:
    # aborted or discarded), "unreferenced" (objects no ack names: completed) or "held" (discarded, but a later
    # checkpoint's channel state references its objects: kept until nothing does). See app/domain/cleanup.py.
    cleanup: Mapped[str | None] = mapped_column(String(16), nullable=True)
    cleanup_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True, index=True)


class AckRow(Base):
    __tablename__ = "acks"
    __table_args__ = (
        ForeignKeyConstraint(
            ["job_id", "checkpoint_id"], ["checkpoints.job_id", "checkpoints.id"], ondelete="CASCADE"
        ),
    )

    job_id: Mapped[int] = mapped_column(JobId, primary_key=True)
    checkpoint_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    vertex: Mapped[str] = mapped_column(String(128), primary_key=True)
    subtask_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer)
    content_hash: Mapped[str] = mapped_column(String(64))
    ack_ts: Mapped[int] = mapped_column(BigInteger)
    sync_duration: Mapped[int] = mapped_column(BigInteger, default=0)
    async_duration: Mapped[int] = mapped_column(BigInteger, default=0)
    alignment_duration: Mapped[int] = mapped_column(BigInteger, default=0)
    start_delay: Mapped[int] = mapped_column(BigInteger, default=0)
    processed_data: Mapped[int] = mapped_column(BigInteger, default=0)
    persisted_data: Mapped[int] = mapped_column(BigInteger, default=0)
    state_size: Mapped[int] = mapped_column(BigInteger, default=0)
    unaligned: Mapped[bool] = mapped_column(Boolean, default=False)
    aligned_over_budget: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    operator_blob_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    channel_blob_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    segments: Mapped[list[Any]] = mapped_column(JSON, default=list)
    source_offsets: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    key_group_start: Mapped[int | None] = mapped_column(Integer, nullable=True)
    key_group_end: Mapped[int | None] = mapped_column(Integer, nullable=True)


class BlobRow(Base):
    __tablename__ = "blobs"
    __table_args__ = (
        UniqueConstraint("job_id", "checkpoint_id", "vertex", "subtask_index", "kind"),
        Index("ix_blobs_status", "status"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    job_id: Mapped[int] = mapped_column(JobId)
    checkpoint_id: Mapped[int] = mapped_column(BigInteger)
    vertex: Mapped[str] = mapped_column(String(128))
    subtask_index: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    # stored: referenced or referable; deleting: no longer referenced, its bytes are being removed.
    status: Mapped[str] = mapped_column(String(16), default="stored")
    created_at: Mapped[int] = mapped_column(BigInteger)
    # The object holding the blob and where the blob starts in it: one object a subtask wrote holds its operator
    # state and, after it, its channel state. NULL: a blob stored before the per-checkpoint layout, the whole
    # object `job-<id>/<blob id>`.
    key: Mapped[str | None] = mapped_column(String(300), nullable=True)
    offset: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # Why a restoring subtask found the blob corrupt (its report); a restore plan passes its checkpoint over.
    corrupt: Mapped[str | None] = mapped_column(Text, nullable=True)


class ChannelStateRefRow(Base):
    """An ack's channel state references an object an earlier checkpoint of the same job wrote (incremental channel
    state): while the referencing checkpoint is not released, the referenced checkpoint's prefix is kept."""

    __tablename__ = "channel_state_refs"
    __table_args__ = (
        ForeignKeyConstraint(
            ["job_id", "checkpoint_id"], ["checkpoints.job_id", "checkpoints.id"], ondelete="CASCADE"
        ),
        Index("ix_channel_state_refs_job_id_ref_checkpoint_id", "job_id", "ref_checkpoint_id"),
    )

    job_id: Mapped[int] = mapped_column(JobId, primary_key=True)
    checkpoint_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    vertex: Mapped[str] = mapped_column(String(128), primary_key=True)
    subtask_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(300), primary_key=True)
    ref_checkpoint_id: Mapped[int] = mapped_column(BigInteger)


class EventRow(Base):
    __tablename__ = "events"
    __table_args__ = (ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),)

    job_id: Mapped[int] = mapped_column(JobId, primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    type: Mapped[str] = mapped_column(String(64))
    ts: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
