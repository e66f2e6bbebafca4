"""scheduler state: a job's last scheduler failure, when its periodic checkpoints may start, and which subtasks
of an attempt reported running

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 21:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("scheduler_error", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("periodic_from", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("running_at", sa.BigInteger(), nullable=True))
    job_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "running_subtasks",
        sa.Column("job_id", job_id, nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("vertex", sa.String(length=128), nullable=False),
        sa.Column("subtask_index", sa.Integer(), nullable=False),
        sa.Column("reported_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_running_subtasks_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "attempt", "vertex", "subtask_index", name=op.f("pk_running_subtasks")),
    )


def downgrade() -> None:
    op.drop_table("running_subtasks")
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("running_at")
        batch_op.drop_column("periodic_from")
        batch_op.drop_column("scheduler_error")
