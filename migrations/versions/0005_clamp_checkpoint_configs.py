"""stored checkpoint configs within today's bounds: durations at most a week, counts within their ranges

Older versions accepted any integer (a timeout of 1e19 ms made every trigger of its job fail); such a job is
brought within the bounds the API now checks, so every stored job can be read and scheduled.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 22:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

WEEK = 7 * 24 * 3600 * 1000
RANGES = {  # as contract.models.CONFIG_RANGES when this migration was written
    "interval": (1, WEEK),
    "timeout": (1, WEEK),
    "min_pause": (0, WEEK),
    "max_concurrent": (1, 1000),
    "alignment_timeout": (0, WEEK - 1),
    "tolerable_failures": (0, 1_000_000),
    "retained": (1, 1000),
}


def clamp(config: dict) -> dict:
    out = dict(config)
    for key, (lo, hi) in RANGES.items():
        value = out.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = int(min(max(value, lo), hi))
    timeout, alignment = out.get("timeout"), out.get("alignment_timeout")
    if isinstance(timeout, int) and isinstance(alignment, int) and alignment >= timeout:
        out["alignment_timeout"] = timeout - 1
    return out


def upgrade() -> None:
    jobs = sa.table("jobs", sa.column("id", sa.BigInteger()), sa.column("config", sa.JSON()))
    bind = op.get_bind()
    for job_id, config in bind.execute(sa.select(jobs.c.id, jobs.c.config)).all():
        if isinstance(config, dict) and clamp(config) != config:
            bind.execute(sa.update(jobs).where(jobs.c.id == job_id).values(config=clamp(config)))


def downgrade() -> None:
    pass  # the clamped values are valid in every version
