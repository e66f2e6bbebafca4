"""what each subtask did with a checkpoint: acks say when one took it aligned over the in-flight budget, and
checkpoints count their unaligned and over-budget subtasks and keep their longest start delay

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28 04:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("acks") as batch_op:
        batch_op.add_column(sa.Column("aligned_over_budget", sa.Boolean(), nullable=False, server_default=sa.false()))
    with op.batch_alter_table("checkpoints") as batch_op:
        batch_op.add_column(sa.Column("num_unaligned", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("num_over_budget", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("start_delay", sa.BigInteger(), nullable=True))
    # the checkpoints recorded before: their unaligned subtasks, from their acks (over budget was not recorded)
    acks = sa.table(
        "acks", sa.column("job_id"), sa.column("checkpoint_id"), sa.column("unaligned", sa.Boolean()),
        sa.column("start_delay", sa.BigInteger()),
    )
    checkpoints = sa.table(
        "checkpoints", sa.column("job_id"), sa.column("id"), sa.column("num_unaligned"), sa.column("start_delay")
    )
    mine = (acks.c.job_id == checkpoints.c.job_id) & (acks.c.checkpoint_id == checkpoints.c.id)
    unaligned = sa.select(sa.func.count()).select_from(acks).where(mine, acks.c.unaligned).scalar_subquery()
    start_delay = sa.select(sa.func.max(acks.c.start_delay)).where(mine).scalar_subquery()
    op.execute(checkpoints.update().values(num_unaligned=unaligned, start_delay=start_delay))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch_op:
        batch_op.drop_column("start_delay")
        batch_op.drop_column("num_over_budget")
        batch_op.drop_column("num_unaligned")
    with op.batch_alter_table("acks") as batch_op:
        batch_op.drop_column("aligned_over_budget")
