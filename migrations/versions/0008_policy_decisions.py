"""checkpoints of the adaptive policy record what it chose and why

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 21:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch_op:
        batch_op.add_column(sa.Column("decision", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch_op:
        batch_op.drop_column("decision")
