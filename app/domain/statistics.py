"""Flink-style checkpoint statistics of a job: counts, the latest checkpoints, and min/avg/max summaries of the
recent completed ones."""

from __future__ import annotations

from sqlalchemy import not_, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import CheckpointRow
from app.domain.context import get_job_or_404
from app.domain.lifecycle import ABORTED, COMPLETED, PENDING
from app.domain.views import _counts, _is_interrupted, checkpoint_model, summarize
from contract.models import (
    Checkpoint,
    CheckpointCounts,
    CheckpointStatistics,
    CheckpointSummary,
    LatestCheckpoints,
)


async def statistics(s: AsyncSession, job_id: int, history_size: int = 10) -> CheckpointStatistics:
    await get_job_or_404(s, job_id)
    counts = (await _counts(s, [job_id]))[job_id]
    # only the figures the summary needs, not whole rows (their JSON columns): a long history has many thousands
    completed = (
        await s.execute(
            select(
                CheckpointRow.completed_ts,
                CheckpointRow.trigger_ts,
                CheckpointRow.state_size,
                CheckpointRow.persisted_data,
                CheckpointRow.processed_data,
                CheckpointRow.alignment_duration,
            )
            .where(CheckpointRow.job_id == job_id, CheckpointRow.status == COMPLETED)
            .order_by(CheckpointRow.id.desc())
            .limit(100_000)
        )
    ).all()
    summary = CheckpointSummary(
        end_to_end_duration=summarize([c.completed_ts - c.trigger_ts for c in completed if c.completed_ts]),
        state_size=summarize([c.state_size for c in completed]),
        persisted_data=summarize([c.persisted_data for c in completed]),
        processed_data=summarize([c.processed_data for c in completed]),
        alignment_duration=summarize(
            [c.alignment_duration for c in completed if c.alignment_duration is not None]
        ),
    )

    async def latest(*conds) -> Checkpoint | None:
        row = (
            await s.execute(
                select(CheckpointRow)
                .where(CheckpointRow.job_id == job_id, *conds)
                .order_by(CheckpointRow.id.desc())
                .limit(1)
            )
        ).scalar_one_or_none()
        return checkpoint_model(row) if row else None

    history = (
        await s.execute(
            select(CheckpointRow)
            .where(CheckpointRow.job_id == job_id)
            .order_by(CheckpointRow.id.desc())
            .limit(history_size)
        )
    ).scalars()
    return CheckpointStatistics(
        counts=CheckpointCounts(
            total=sum(counts.get(status, 0) for status in (PENDING, COMPLETED, ABORTED)),
            in_progress=counts.get(PENDING, 0),
            completed=counts.get(COMPLETED, 0),
            failed=counts.get(ABORTED, 0) - counts.get("interrupted", 0),
            not_finished=counts.get("interrupted", 0),
            aborted=counts.get(ABORTED, 0),
            savepoints=counts["savepoints"],
            interrupted=counts.get("interrupted", 0),
        ),
        summary=summary,
        latest=LatestCheckpoints(
            completed=await latest(CheckpointRow.status == COMPLETED, CheckpointRow.is_savepoint.is_(False)),
            savepoint=await latest(CheckpointRow.status == COMPLETED, CheckpointRow.is_savepoint.is_(True)),
            failed=await latest(CheckpointRow.status == ABORTED, not_(_is_interrupted())),
        ),
        history=[checkpoint_model(r) for r in history],
    )
