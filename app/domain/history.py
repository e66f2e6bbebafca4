"""Checkpoint history: the database keeps each job's newest checkpoints, and older ones only while something needs them.

Every checkpoint leaves a row, one ack row per subtask and its blob rows: a job of 2,000 subtasks checkpointing every
10 s writes 17 million ack rows a day. Like the event log (`OVERTAKE_EVENT_RETENTION`), the history is trimmed: a
checkpoint more than `OVERTAKE_CHECKPOINT_HISTORY` ids behind its job's newest is deleted with its acks, references
and blob rows once nothing needs it. Never trimmed: pending checkpoints, savepoints, completed checkpoints kept for
restore (retention decides those), a checkpoint whose objects are not cleaned yet, and one whose objects a kept
checkpoint's channel state references.
"""

from __future__ import annotations

import logging

from sqlalchemy import and_, delete, exists, not_, select

from app.db.models import BlobRow, ChannelStateRefRow, CheckpointRow, JobRow
from app.domain.context import Context, lock_job
from app.domain.lifecycle import COMPLETED, PENDING

log = logging.getLogger(__name__)
BATCH = 1000  # checkpoints deleted per transaction (a job far behind is trimmed over several sweeps)


def _trimmable(keep: int):
    """The condition on a checkpoint (joined with its job) under which the history may drop it."""
    cp = CheckpointRow
    referenced = exists().where(ChannelStateRefRow.job_id == cp.job_id, ChannelStateRefRow.ref_checkpoint_id == cp.id)
    return and_(
        cp.job_id == JobRow.id,
        cp.id < JobRow.next_checkpoint_id - keep,
        cp.status != PENDING,
        cp.is_savepoint.is_(False),
        not_(and_(cp.status == COMPLETED, cp.discarded.is_(False))),  # kept for restore: retention's to release
        cp.cleanup.is_(None),  # its objects are gone from the store (or there were none)
        not_(referenced),
    )


async def trim(ctx: Context, keep: int) -> int:
    """Delete the checkpoints the history no longer keeps (`keep` ids behind each job's newest), at most `BATCH` per
    job and sweep; returns how many were deleted. Only jobs that have such checkpoints are visited."""
    async with ctx.tx(readonly=True) as s:
        jobs = list(
            (
                await s.execute(
                    select(JobRow.id).where(
                        JobRow.next_checkpoint_id > keep + 1, exists().where(_trimmable(keep))
                    )
                )
            ).scalars()
        )
    deleted = 0
    for job_id in jobs:
        async with ctx.tx() as s:
            # one lock order everywhere: the job's row first (skipped while busy: the next sweep comes back)
            if await lock_job(s, job_id, skip_locked=True) is None:
                continue
            ids = list(
                (
                    await s.execute(
                        select(CheckpointRow.id)
                        .join(JobRow, JobRow.id == CheckpointRow.job_id)
                        .where(CheckpointRow.job_id == job_id, _trimmable(keep))
                        .order_by(CheckpointRow.id)
                        .limit(BATCH)
                    )
                ).scalars()
            )
            if not ids:
                continue
            await s.execute(delete(BlobRow).where(BlobRow.job_id == job_id, BlobRow.checkpoint_id.in_(ids)))
            # acks and the checkpoints' own references go with them (ON DELETE CASCADE)
            await s.execute(delete(CheckpointRow).where(CheckpointRow.job_id == job_id, CheckpointRow.id.in_(ids)))
        deleted += len(ids)
        log.info("job %s: %d checkpoint(s) older than the newest %d left the history", job_id, len(ids), keep)
    return deleted
