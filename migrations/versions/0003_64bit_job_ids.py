"""64-bit job ids: jobs.id and every job_id column become BIGINT (the API promises ids up to 2**63 - 1)

SQLite's INTEGER already holds 64 bits (and jobs.id must stay INTEGER PRIMARY KEY, the row id), so only
PostgreSQL changes.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 21:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

REFERRING = ("attempts", "checkpoints", "acks", "blobs", "events")


def _change(old: sa.types.TypeEngine, new: sa.types.TypeEngine, sequence_type: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in REFERRING:
        op.alter_column(table, "job_id", type_=new, existing_type=old, existing_nullable=False)
    op.alter_column("jobs", "id", type_=new, existing_type=old, existing_nullable=False)
    op.execute(f"ALTER SEQUENCE IF EXISTS jobs_id_seq AS {sequence_type}")


def upgrade() -> None:
    _change(sa.Integer(), sa.BigInteger(), "bigint")


def downgrade() -> None:
    _change(sa.BigInteger(), sa.Integer(), "integer")
