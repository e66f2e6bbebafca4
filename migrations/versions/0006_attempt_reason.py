"""attempts say why they started (a restart after a failure, a rescale to the slots a cluster offers)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 22:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch_op:
        batch_op.add_column(sa.Column("reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch_op:
        batch_op.drop_column("reason")
