"""Restore plans: which checkpoint an attempt restores, and per subtask its state slices, channel-state
segments in replay order and source offsets. Blobs are verified; a checkpoint with a missing or corrupt
blob is passed over for the previous completed one, and the plan says which and why.

Rescaling: keyed operator state is split by key-group range; input channel state of hash edges goes to every
new subtask (each keeps the records of its key groups); other operator state, channel state and source offsets
of old subtask j go to new subtask j mod the new parallelism.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Literal

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.blobstore import blob_key
from app.db.models import AckRow, BlobRow, CheckpointRow, JobRow
from app.domain.context import Context
from app.domain.graph import key_group_range
from app.domain.lifecycle import COMPLETED
from app.errors import Conflict, NotFound
from client.models import (
    Partitioning,
    PlanFallback,
    RestorePlan,
    RestoreSegment,
    RestoreState,
    SubtaskRestore,
)

Requested = int | Literal["latest"] | None


async def select_checkpoint(s: AsyncSession, job: JobRow, requested: Requested) -> list[CheckpointRow]:
    """The checkpoints to try, best first: the requested one (or the latest) and the completed ones before it."""
    if requested is None:
        return []
    q = select(CheckpointRow).where(
        CheckpointRow.job_id == job.id, CheckpointRow.status == COMPLETED, CheckpointRow.discarded.is_(False)
    )
    if requested != "latest":
        cp = await s.get(CheckpointRow, (job.id, requested))
        if cp is None:
            raise NotFound(f"job {job.id} has no checkpoint {requested} to restore from")
        if cp.status != COMPLETED:
            raise Conflict(
                f"checkpoint {requested} of job {job.id} is {cp.status}"
                + (f" ({cp.failure_reason})" if cp.failure_reason else "")
                + "; only a completed checkpoint or savepoint can be restored"
            )
        if cp.discarded:
            raise Conflict(
                f"checkpoint {requested} of job {job.id} was collected under the retention policy "
                f"(retained={job.config.get('retained')}); restore from a newer checkpoint or a savepoint"
            )
        q = q.where(CheckpointRow.id <= requested)
    return list((await s.execute(q.order_by(CheckpointRow.id.desc()).limit(20))).scalars())


async def _verify(ctx: Context, job_id: int, acks: list[AckRow], rows: dict[str, BlobRow]) -> str | None:
    """None if every blob of these acks is stored with its recorded checksum, else what is wrong."""
    for a in acks:
        for blob_id in (a.operator_blob_id, a.channel_blob_id):
            if not blob_id:
                continue
            row = rows.get(blob_id)
            who = f"{a.vertex}[{a.subtask_index}]"
            if row is None or row.status != "stored":
                return f"blob {blob_id} of subtask {who} is no longer stored"
            if ctx.settings.verify_blobs_on_restore:
                actual = await ctx.store.sha256(blob_key(job_id, blob_id))
                if actual is None:
                    return f"blob {blob_id} of subtask {who} is missing from the blob store"
                if actual != row.sha256:
                    return (
                        f"blob {blob_id} of subtask {who} is corrupt: sha256 {actual}, expected {row.sha256}"
                    )
    return None


async def build_plan(
    ctx: Context, s: AsyncSession, job: JobRow, candidates: list[CheckpointRow], requested: Requested
) -> RestorePlan:
    fallbacks: list[PlanFallback] = []
    for cp in candidates:
        acks = list(
            (
                await s.execute(select(AckRow).where(AckRow.job_id == job.id, AckRow.checkpoint_id == cp.id))
            ).scalars()
        )
        ids = [b for a in acks for b in (a.operator_blob_id, a.channel_blob_id) if b]
        rows = {}
        if ids:
            rows = {b.id: b for b in (await s.execute(select(BlobRow).where(BlobRow.id.in_(ids)))).scalars()}
        problem = await _verify(ctx, job.id, acks, rows)
        if problem is None:
            return _plan(job, cp, acks, rows, requested, fallbacks)
        fallbacks.append(PlanFallback(checkpoint_id=cp.id, reason=problem))
    # Nothing usable (or a fresh start was asked for): start fresh; `fallbacks` says why.
    return RestorePlan(
        job_id=job.id, checkpoint_id=None, requested=requested, fallbacks=fallbacks, subtasks=_fresh(job)
    )


def _fresh(job: JobRow) -> list[SubtaskRestore]:
    out = []
    for v in job.graph["vertices"]:
        for i in range(v["parallelism"]):
            kg = key_group_range(v["max_parallelism"], v["parallelism"], i)
            out.append(
                SubtaskRestore(vertex=v["id"], subtask_index=i, key_group_start=kg[0], key_group_end=kg[1])
            )
    return out


def _segments(a: AckRow, direction: str) -> list[RestoreSegment]:
    segs = [seg for seg in a.segments if seg["direction"] == direction]
    segs.sort(key=lambda seg: (seg["channel"], seg["offset"]))
    return [RestoreSegment(**seg, blob_id=a.channel_blob_id, from_subtask=a.subtask_index) for seg in segs]


def _plan(
    job: JobRow,
    cp: CheckpointRow,
    acks: list[AckRow],
    blobs: dict[str, BlobRow],
    requested: Requested,
    fallbacks: list[PlanFallback],
) -> RestorePlan:
    by_vertex: dict[str, list[AckRow]] = defaultdict(list)
    for a in acks:
        by_vertex[a.vertex].append(a)
    subtasks: list[SubtaskRestore] = []
    for v in job.graph["vertices"]:
        old = sorted(by_vertex.get(v["id"], []), key=lambda a: a.subtask_index)
        old_p = len(old)
        p, maxp = v["parallelism"], v["max_parallelism"]
        for i in range(p):
            kg_start, kg_end = key_group_range(maxp, p, i)
            sub = SubtaskRestore(
                vertex=v["id"], subtask_index=i, key_group_start=kg_start, key_group_end=kg_end
            )
            if v.get("keyed") and old_p and old_p != p:
                owners = [a for a in old if a.key_group_start is not None and a.key_group_end is not None]
                mine = [a for a in owners if a.key_group_start <= kg_end and a.key_group_end >= kg_start]
                sources = [a for a in old if a.subtask_index % p == i]
            else:
                mine = [a for a in old if a.subtask_index % p == i]
                sources = mine
            for a in mine:
                if a.operator_blob_id:
                    sub.operator_state.append(
                        _state(a, blobs[a.operator_blob_id], kg_start, kg_end, v.get("keyed", False))
                    )
            offsets: dict = {}
            rescaled = bool(old_p) and old_p != p
            for a in sources:
                sub.output_channel_state += _segments(a, "output")
                sub.input_channel_state += [
                    seg for seg in _segments(a, "input") if not (rescaled and seg.partitioning == Partitioning.hash)
                ]
                if a.source_offsets:
                    offsets.update(a.source_offsets)
            if rescaled:
                # Records of hash edges belong to key groups, not to old subtasks: every new subtask gets every
                # old hash-partitioned input segment and keeps the records of its own key groups.
                for a in old:
                    sub.input_channel_state += [
                        seg for seg in _segments(a, "input") if seg.partitioning == Partitioning.hash
                    ]
            sub.source_offsets = offsets or None
            subtasks.append(sub)
    return RestorePlan(
        job_id=job.id,
        checkpoint_id=cp.id,
        is_savepoint=cp.is_savepoint,
        requested=requested,
        fallbacks=fallbacks,
        subtasks=subtasks,
    )


def _state(a: AckRow, blob: BlobRow, kg_start: int, kg_end: int, keyed: bool) -> RestoreState:
    return RestoreState(
        blob_id=blob.id,
        sha256=blob.sha256,
        size=blob.size,
        from_subtask=a.subtask_index,
        key_group_start=max(kg_start, a.key_group_start) if keyed and a.key_group_start is not None else None,
        key_group_end=min(kg_end, a.key_group_end) if keyed and a.key_group_end is not None else None,
    )
