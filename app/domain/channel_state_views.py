"""Read models of a checkpoint's channel state: the manifest of its segments per subtask, one subtask's entry,
and when its blobs were discarded."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AckRow, CheckpointRow, JobRow
from app.domain.checkpoints import get_checkpoint_or_404
from app.domain.context import get_job_or_404
from app.domain.lifecycle import ABORTED, COMPLETED
from contract.models import (
    ChannelSegment,
    ChannelStateEntry,
    ChannelStateManifest,
)


async def channel_state_manifest(s: AsyncSession, job_id: int, checkpoint_id: int) -> ChannelStateManifest:
    job = await get_job_or_404(s, job_id)
    cp = await get_checkpoint_or_404(s, job_id, checkpoint_id)
    acks = (
        await s.execute(
            select(AckRow)
            .where(AckRow.job_id == job_id, AckRow.checkpoint_id == checkpoint_id)
            .order_by(AckRow.vertex, AckRow.subtask_index)
        )
    ).scalars()
    entries = [e for e in map(_channel_state_entry, acks) if e is not None]
    manifest = ChannelStateManifest(job_id=job_id, checkpoint_id=checkpoint_id, entries=entries)
    if cp.status == ABORTED:
        manifest.deleted, manifest.deleted_reason, manifest.deleted_at = True, "aborted", cp.completed_ts
    elif cp.discarded:
        manifest.deleted, manifest.deleted_reason = True, "retention"
        manifest.deleted_at = await _discarded_at(s, job, cp)
    return manifest


def _channel_state_entry(a: AckRow) -> ChannelStateEntry | None:
    # an ack whose segments all reference earlier checkpoints' blobs has no blob of its own
    if a.channel_blob_id is None and not a.segments:
        return None
    return ChannelStateEntry(
        vertex=a.vertex,
        subtask_index=a.subtask_index,
        blob_id=a.channel_blob_id,
        segments=[ChannelSegment.model_validate(seg) for seg in a.segments],
    )


async def channel_state_entry(
    s: AsyncSession, job_id: int, checkpoint_id: int, vertex: str, subtask_index: int
) -> ChannelStateEntry | None:
    """One subtask's entry of a checkpoint's channel-state manifest (None: it has no channel state), read alone:
    the manifest of a big job holds thousands."""
    await get_job_or_404(s, job_id)
    await get_checkpoint_or_404(s, job_id, checkpoint_id)
    ack = await s.get(AckRow, (job_id, checkpoint_id, vertex, subtask_index))
    return _channel_state_entry(ack) if ack is not None else None


async def _discarded_at(s: AsyncSession, job: JobRow, cp: CheckpointRow) -> int | None:
    """When retention collected a checkpoint: the completion of the checkpoint that left it outside the newest
    `retained` completed ones (the rule of `apply_retention`, which keeps no time of its own)."""
    retained = max(1, int(job.config.get("retained", 1)))
    newer = (
        await s.execute(
            select(CheckpointRow.completed_ts)
            .where(
                CheckpointRow.job_id == job.id,
                CheckpointRow.id > cp.id,
                CheckpointRow.status == COMPLETED,
                CheckpointRow.is_savepoint.is_(False),
            )
            .order_by(CheckpointRow.id)
            .offset(retained - 1)
            .limit(1)
        )
    ).scalar_one_or_none()
    return newer
