"""state written straight into the blob store: where each blob lies (its object's key and its offset in it), blobs
reported corrupt, and what is left to clean under each checkpoint's prefix

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 09:00:00

Rows of older blobs keep a NULL key: their object is ``job-<id>/<blob id>``, the whole of it. Checkpoints whose
blobs were being deleted when the coordinator stopped are handed to the cleanup sweep.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("blobs") as batch_op:
        batch_op.add_column(sa.Column("key", sa.String(length=300), nullable=True))
        batch_op.add_column(sa.Column("offset", sa.BigInteger(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("corrupt", sa.Text(), nullable=True))
    with op.batch_alter_table("checkpoints") as batch_op:
        batch_op.add_column(sa.Column("cleanup", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("cleanup_at", sa.BigInteger(), nullable=True))
        batch_op.create_index(batch_op.f("ix_checkpoints_cleanup_at"), ["cleanup_at"], unique=False)
    op.execute(
        "UPDATE checkpoints SET cleanup = 'prefix', cleanup_at = 0 WHERE EXISTS (SELECT 1 FROM blobs WHERE "
        "blobs.job_id = checkpoints.job_id AND blobs.checkpoint_id = checkpoints.id AND blobs.status = 'deleting')"
    )


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch_op:
        batch_op.drop_index(batch_op.f("ix_checkpoints_cleanup_at"))
        batch_op.drop_column("cleanup_at")
        batch_op.drop_column("cleanup")
    with op.batch_alter_table("blobs") as batch_op:
        batch_op.drop_column("corrupt")
        batch_op.drop_column("offset")
        batch_op.drop_column("key")
