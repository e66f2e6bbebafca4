"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-21 22:21:51.443419
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "blobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("checkpoint_id", sa.BigInteger(), nullable=False),
        sa.Column("vertex", sa.String(length=128), nullable=False),
        sa.Column("subtask_index", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_blobs")),
        sa.UniqueConstraint(
            "job_id",
            "checkpoint_id",
            "vertex",
            "subtask_index",
            "kind",
            name=op.f("uq_blobs_job_id_checkpoint_id_vertex_subtask_index_kind"),
        ),
    )
    with op.batch_alter_table("blobs", schema=None) as batch_op:
        batch_op.create_index("ix_blobs_status", ["status"], unique=False)

    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("status_message", sa.Text(), nullable=True),
        sa.Column("graph", sa.JSON(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("num_subtasks", sa.Integer(), nullable=False),
        sa.Column("current_attempt", sa.Integer(), nullable=True),
        sa.Column("next_checkpoint_id", sa.BigInteger(), nullable=False),
        sa.Column("event_seq", sa.BigInteger(), nullable=False),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False),
        sa.Column("last_trigger_at", sa.BigInteger(), nullable=True),
        sa.Column("last_completed_at", sa.BigInteger(), nullable=True),
        sa.Column("latest_completed_id", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_name"), ["name"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_status"), ["status"], unique=False)

    op.create_table(
        "attempts",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("restored_checkpoint_id", sa.BigInteger(), nullable=True),
        sa.Column("started_at", sa.BigInteger(), nullable=False),
        sa.Column("ended_at", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_attempts_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "number", name=op.f("pk_attempts")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_attempts_token_hash")),
    )
    op.create_table(
        "checkpoints",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("is_savepoint", sa.Boolean(), nullable=False),
        sa.Column("stop_job", sa.Boolean(), nullable=False),
        sa.Column("policy", sa.String(length=32), nullable=False),
        sa.Column("alignment_timeout", sa.Integer(), nullable=True),
        sa.Column("trigger_ts", sa.BigInteger(), nullable=False),
        sa.Column("timeout_at", sa.BigInteger(), nullable=False),
        sa.Column("switch_at", sa.BigInteger(), nullable=True),
        sa.Column("switched_ts", sa.BigInteger(), nullable=True),
        sa.Column("latest_ack_ts", sa.BigInteger(), nullable=True),
        sa.Column("completed_ts", sa.BigInteger(), nullable=True),
        sa.Column("num_subtasks", sa.Integer(), nullable=False),
        sa.Column("num_acked", sa.Integer(), nullable=False),
        sa.Column("state_size", sa.BigInteger(), nullable=False),
        sa.Column("persisted_data", sa.BigInteger(), nullable=False),
        sa.Column("processed_data", sa.BigInteger(), nullable=False),
        sa.Column("alignment_duration", sa.BigInteger(), nullable=True),
        sa.Column("any_unaligned", sa.Boolean(), nullable=False),
        sa.Column("failure_reason", sa.Text(), nullable=True),
        sa.Column("discarded", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_checkpoints_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "id", name=op.f("pk_checkpoints")),
    )
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.create_index("ix_checkpoints_job_id_status", ["job_id", "status"], unique=False)
        batch_op.create_index("ix_checkpoints_status_timeout_at", ["status", "timeout_at"], unique=False)

    op.create_table(
        "events",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("ts", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_events_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "seq", name=op.f("pk_events")),
    )
    op.create_table(
        "acks",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("checkpoint_id", sa.BigInteger(), nullable=False),
        sa.Column("vertex", sa.String(length=128), nullable=False),
        sa.Column("subtask_index", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("content_hash", sa.String(length=64), nullable=False),
        sa.Column("ack_ts", sa.BigInteger(), nullable=False),
        sa.Column("sync_duration", sa.BigInteger(), nullable=False),
        sa.Column("async_duration", sa.BigInteger(), nullable=False),
        sa.Column("alignment_duration", sa.BigInteger(), nullable=False),
        sa.Column("start_delay", sa.BigInteger(), nullable=False),
        sa.Column("processed_data", sa.BigInteger(), nullable=False),
        sa.Column("persisted_data", sa.BigInteger(), nullable=False),
        sa.Column("state_size", sa.BigInteger(), nullable=False),
        sa.Column("unaligned", sa.Boolean(), nullable=False),
        sa.Column("operator_blob_id", sa.String(length=32), nullable=True),
        sa.Column("channel_blob_id", sa.String(length=32), nullable=True),
        sa.Column("segments", sa.JSON(), nullable=False),
        sa.Column("source_offsets", sa.JSON(), nullable=True),
        sa.Column("key_group_start", sa.Integer(), nullable=True),
        sa.Column("key_group_end", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id", "checkpoint_id"],
            ["checkpoints.job_id", "checkpoints.id"],
            name=op.f("fk_acks_job_id_checkpoints"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "checkpoint_id", "vertex", "subtask_index", name=op.f("pk_acks")),
    )


def downgrade() -> None:
    op.drop_table("acks")
    op.drop_table("events")
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_index("ix_checkpoints_status_timeout_at")
        batch_op.drop_index("ix_checkpoints_job_id_status")

    op.drop_table("checkpoints")
    op.drop_table("attempts")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_status"))
        batch_op.drop_index(batch_op.f("ix_jobs_name"))

    op.drop_table("jobs")
    with op.batch_alter_table("blobs", schema=None) as batch_op:
        batch_op.drop_index("ix_blobs_status")

    op.drop_table("blobs")
