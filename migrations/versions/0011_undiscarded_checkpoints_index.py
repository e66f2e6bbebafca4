"""an index of each job's checkpoints not discarded yet: retention, at every completion, reads those newest first,
not the job's whole history of discarded ones

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-29 17:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_checkpoints_job_id_id_undiscarded", "checkpoints", ["job_id", "id"],
        postgresql_where=sa.text("discarded IS false"), sqlite_where=sa.text("discarded IS 0"),
    )


def downgrade() -> None:
    op.drop_index("ix_checkpoints_job_id_id_undiscarded", table_name="checkpoints")
