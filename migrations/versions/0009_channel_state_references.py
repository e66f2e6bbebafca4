"""incremental channel state: which earlier checkpoints' objects an ack's channel state references

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 22:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

JobId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "channel_state_refs",
        sa.Column("job_id", JobId, nullable=False),
        sa.Column("checkpoint_id", sa.BigInteger(), nullable=False),
        sa.Column("vertex", sa.String(length=128), nullable=False),
        sa.Column("subtask_index", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=300), nullable=False),
        sa.Column("ref_checkpoint_id", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id", "checkpoint_id"],
            ["checkpoints.job_id", "checkpoints.id"],
            name=op.f("fk_channel_state_refs_job_id_checkpoints"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "job_id", "checkpoint_id", "vertex", "subtask_index", "key", name=op.f("pk_channel_state_refs")
        ),
    )
    op.create_index(
        "ix_channel_state_refs_job_id_ref_checkpoint_id", "channel_state_refs", ["job_id", "ref_checkpoint_id"]
    )


def downgrade() -> None:
    op.drop_index("ix_channel_state_refs_job_id_ref_checkpoint_id", table_name="channel_state_refs")
    op.drop_table("channel_state_refs")
