"""Restore plans: which checkpoint an attempt restores, and per subtask its state slices, channel-state
segments in replay order, source offsets, and where to read each blob (straight from the blob store: a file:// URL
or a presigned GET, and the blob's offset in its object). Blobs are checked (OVERTAKE_VERIFY_BLOBS_ON_RESTORE:
stat, each object exists with its size, or sha256, each blob read and hashed); a checkpoint with a missing, cut or
corrupt blob, or one a subtask reported corrupt, is passed over for the previous completed one, and the plan says
which and why. Subtasks verify each blob's sha256 as they read it and report a mismatch (POST
.../blobs/{blob_id}/corrupt).

Rescaling (a vertex restored with another parallelism than the checkpoint's), per new subtask *i* of *p*:

- keyed operator state: the slices of the old subtasks whose key-group range overlaps *i*'s (each subtask loads
  only its own key groups); other operator state: old subtask *j* goes to *j mod p*;
- input channel state of hash edges: the segments of the old subtasks whose key-group range overlaps *i*'s (the
  subtask keeps the records of its key groups); of rebalance and forward edges: old *j* to *j mod p*; of broadcast
  edges: old *j* to *j* while it exists;
- output channel state: old *j*'s to *j mod p*, which re-sends it partitioned for the new parallelism downstream;
- source positions: every old source subtask's, so each new one takes the splits it owns.

The order the runtime keeps (``spark_plugin.network.input``'s recovery order and ``docs/recovery.md``) does not
depend on which new subtask re-sends which output state.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left, bisect_right
from collections import defaultdict
from typing import Literal

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.blobstore import store_answers
from app.db.models import AckRow, AttemptRow, BlobRow, CheckpointRow, JobRow
from app.domain import written
from app.domain.blobs import object_of
from app.domain.context import Context, now_ms
from app.domain.lifecycle import COMPLETED
from app.errors import Conflict, NotFound
from contract.keygroups import key_group_range
from contract.models import (
    AfterAttempt,
    BlobLocation,
    Partitioning,
    PlanFallback,
    RestorePlan,
    RestoreSegment,
    RestoreState,
    SourcePosition,
    SubtaskRestore,
    VertexRescale,
)

Requested = int | Literal["latest"] | AfterAttempt | None


async def left_off(s: AsyncSession, job: JobRow, after: AfterAttempt) -> int | None:
    """Where the job's current attempt ``after.attempt`` left off: the newest checkpoint it completed, else the one
    it restored (None: it started fresh and completed none).

    Called while the next attempt opens, holding the job's row lock, which a completing acknowledgement takes too:
    nothing of the old attempt completes between this choice and the abort of its pending checkpoints, so retention
    (which runs as a checkpoint completes) cannot collect the chosen one first, whatever ``retained`` is. Only the
    attempt's own checkpoints descend from what it restored (a run started from an older savepoint must not jump to a
    newer checkpoint of an earlier run)."""
    if job.current_attempt != after.attempt:
        raise Conflict(
            f"job {job.id} is on attempt {job.current_attempt}, not {after.attempt}: only the current attempt can be "
            f"continued where it left off; restore a checkpoint by its id instead"
        )
    newest = (
        await s.execute(
            select(func.max(CheckpointRow.id)).where(
                CheckpointRow.job_id == job.id,
                CheckpointRow.attempt == after.attempt,
                CheckpointRow.status == COMPLETED,
                CheckpointRow.discarded.is_(False),
            )
        )
    ).scalar_one_or_none()
    if newest is not None:
        return newest
    row = await s.get(AttemptRow, (job.id, after.attempt))
    return row.restored_checkpoint_id if row is not None else None


async def select_checkpoint(s: AsyncSession, job: JobRow, requested: Requested) -> list[CheckpointRow]:
    """The checkpoints to try, best first: the requested one (or the latest) and the completed ones before it.
    An ``AfterAttempt`` is resolved first (``left_off``), under the job's row lock, which the caller holds."""
    if isinstance(requested, AfterAttempt):
        requested = await left_off(s, job, requested)
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


STAT_CONCURRENCY = 32  # objects stat'ed at once while a plan is checked


async def _verify(ctx: Context, acks: list[AckRow], rows: dict[str, BlobRow]) -> str | None:
    """None if every blob of these acks is usable, else what is wrong (the first problem found)."""
    used: list[tuple[str, BlobRow]] = []
    for a in acks:
        for blob_id in dict.fromkeys((a.operator_blob_id, a.channel_blob_id, *_referenced(a))):
            if not blob_id:
                continue
            row = rows.get(blob_id)
            who = f"{a.vertex}[{a.subtask_index}]"
            if row is None or row.status != "stored":
                return f"blob {blob_id} of subtask {who} is no longer stored"
            if row.corrupt:
                return f"blob {blob_id} of subtask {who} was {row.corrupt}"
            used.append((who, row))
    if ctx.settings.verify_blobs_on_restore == "sha256":
        return await _verify_sha256(ctx, used)
    return await _verify_sizes(ctx, used)


async def _verify_sizes(ctx: Context, used: list[tuple[str, BlobRow]]) -> str | None:
    """Each object exists with the size its blobs fill (a stat or HEAD per object, a few at a time, never a read)."""
    ends: dict[str, int] = {}
    owner: dict[str, tuple[str, BlobRow]] = {}
    for who, row in used:
        key, offset = object_of(row)
        if offset + row.size >= ends.get(key, -1):
            ends[key], owner[key] = offset + row.size, (who, row)
    gate = asyncio.Semaphore(STAT_CONCURRENCY)

    async def size(key: str) -> int | None:
        # bounded as an ack's stat is: a store that does not answer must not hold the job's row lock (and the
        # request) for as long as its client retries
        async with gate, store_answers(
            f"whether object {key} is there within {written.STAT_TIMEOUT:g} s (no restore plan was made)"
        ):
            return await asyncio.wait_for(ctx.store.size(key), written.STAT_TIMEOUT)

    keys = list(ends)
    sizes = await _all_or_none([size(k) for k in keys])
    for key, actual in zip(keys, sizes, strict=True):
        who, row = owner[key]
        if actual is None:
            return f"blob {row.id} of subtask {who} is missing from the blob store (object {key})"
        if actual != ends[key]:
            return f"blob {row.id} of subtask {who} is cut or overwritten: object {key} has {actual} bytes, not {ends[key]}"
    return None


async def _all_or_none(coros: list) -> list:
    """Every coroutine's result, in order; the first that fails cancels the others, which `asyncio.gather` leaves
    running: a store that stops answering would otherwise keep stat'ing the plan's other objects, each for its whole
    bound, long after the request was answered (and again for every retried restore)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


HASH_FLOOR = 1 << 20
"""Bytes per second a store returns a blob's bytes at the least while a hashing restore reads them: each read may take
a stat's bound plus its size at this rate (1 GiB: about 17 minutes), then the restore is answered 503."""


async def _verify_sha256(ctx: Context, used: list[tuple[str, BlobRow]]) -> str | None:
    """Each blob read whole and hashed (OVERTAKE_VERIFY_BLOBS_ON_RESTORE=sha256), each read bounded as a stat is, plus
    the time its bytes take at `HASH_FLOOR`: a store that stops answering mid-read must not hold the request (and the
    job's row lock) for as long as its client retries."""
    for who, row in used:
        key, offset = object_of(row)
        bound = written.STAT_TIMEOUT + row.size / HASH_FLOOR
        async with store_answers(f"with the bytes of object {key} within {bound:.3g} s (no restore plan was made)"):
            actual = await asyncio.wait_for(ctx.store.sha256(key, offset, row.size), bound)
        if actual is None:
            return f"blob {row.id} of subtask {who} is missing from the blob store (object {key})"
        if actual != row.sha256:
            return f"blob {row.id} of subtask {who} is corrupt: sha256 {actual}, expected {row.sha256}"
    return None


async def _locate(ctx: Context, plan: RestorePlan, rows: dict[str, BlobRow]) -> None:
    """Fill in where each subtask reads each blob its state names: URLs straight into the store (one per object,
    presigned where the store needs it), or none when state goes through the coordinator."""
    urls: dict[str, str] = {}
    expires_at = None
    if ctx.direct_writes:
        expiry = ctx.settings.read_url_expiry
        keys = {object_of(r)[0] for r in rows.values()}
        urls = await ctx.store.read_urls(sorted(keys), expiry)
        if ctx.store.presigned:
            expires_at = now_ms() + expiry * 1000
    for sub in plan.subtasks:
        ids = [st.blob_id for st in sub.operator_state]
        for seg in (*sub.output_channel_state, *sub.input_channel_state):
            ids.append(seg.blob_id)
            ids += [p.blob_id for p in seg.parts or [] if p.blob_id]
        locations = []
        for blob_id in dict.fromkeys(b for b in ids if b):
            row = rows[blob_id]
            key, offset = object_of(row)
            url = urls.get(key)
            locations.append(
                BlobLocation(
                    blob_id=row.id,
                    sha256=row.sha256,
                    size=row.size,
                    url=url,
                    offset=offset,
                    expires_at=expires_at if url else None,
                )
            )
        sub.blobs = locations


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
        ids = [b for a in acks for b in (a.operator_blob_id, a.channel_blob_id, *_referenced(a)) if b]
        rows = {}
        if ids:
            rows = {b.id: b for b in (await s.execute(select(BlobRow).where(BlobRow.id.in_(ids)))).scalars()}
        problem = await _verify(ctx, acks, rows)
        if problem is None:
            plan = _plan(job, cp, acks, rows, requested, fallbacks)
            await _locate(ctx, plan, rows)
            return plan
        fallbacks.append(PlanFallback(checkpoint_id=cp.id, reason=problem))
    # Nothing usable (or a fresh start was asked for): start fresh; `fallbacks` says why.
    return RestorePlan(
        job_id=job.id, checkpoint_id=None, **_requested(requested), fallbacks=fallbacks, subtasks=_fresh(job)
    )


def _requested(requested: Requested) -> dict:
    return {
        "requested_checkpoint": requested if isinstance(requested, int) else None,
        "requested_latest": requested == "latest",
    }


def _referenced(a: AckRow) -> list[str]:
    """The blobs of earlier checkpoints that the ack's channel state references (incremental channel state)."""
    return [p["blob_id"] for seg in a.segments for p in seg.get("parts") or [] if p.get("blob_id")]


def _fresh(job: JobRow) -> list[SubtaskRestore]:
    out = []
    for v in job.graph["vertices"]:
        for i in range(v["parallelism"]):
            kg = key_group_range(i, v["max_parallelism"], v["parallelism"])
            out.append(
                SubtaskRestore(vertex=v["id"], subtask_index=i, key_group_start=kg[0], key_group_end=kg[1])
            )
    return out


def _segments(a: AckRow, direction: str, key_groups: tuple[int, int] | None = None) -> list[RestoreSegment]:
    """The ack's segments of one direction, in replay order; input segments of hash edges say which key groups
    their records belong to (``key_groups``: those of the subtask that persisted them)."""
    segs = [seg for seg in a.segments if seg["direction"] == direction]
    segs.sort(key=lambda seg: (seg["channel"], seg["offset"]))
    out = []
    for seg in segs:
        kg = key_groups if key_groups is not None and seg.get("partitioning") == Partitioning.hash.value else None
        out.append(
            RestoreSegment(
                **seg, blob_id=a.channel_blob_id, from_subtask=a.subtask_index,
                key_group_start=kg[0] if kg else None, key_group_end=kg[1] if kg else None,
            )
        )
    return out


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


class _OldSubtasks:
    """The acks of one vertex's old subtasks (sorted by index), indexed once so that each new subtask finds the ones
    it restores from without scanning them all: a plan stays linear in the number of subtasks."""

    def __init__(self, old: list[AckRow], p: int, maxp: int) -> None:
        self.acks, self.p, self.maxp = old, p, maxp
        self.rescaled = bool(old) and len(old) != p
        self.ranges = [key_group_range(a.subtask_index, maxp, len(old)) for a in old]
        # key-group ranges grow with the subtask index: the old subtasks overlapping a range are consecutive
        self._starts = [r[0] for r in self.ranges]
        self._ends = [r[1] for r in self.ranges]
        self._mapped: dict[int, list[int]] = defaultdict(list)
        self._same: dict[int, int] = {}
        for pos, a in enumerate(old):
            self._mapped[a.subtask_index % p if self.rescaled else a.subtask_index].append(pos)
            self._same[a.subtask_index] = pos

    def mapped(self, i: int) -> list[int]:
        """Positions of the old subtasks that map to new subtask ``i``: the same index, or (rescaled) ``j mod p``."""
        return self._mapped.get(i, [])

    def same(self, i: int) -> int | None:
        """Position of the old subtask with index ``i``."""
        return self._same.get(i)

    def overlapping(self, kg: tuple[int, int]) -> range:
        """Positions of the old subtasks whose key-group range overlaps ``kg``."""
        return range(bisect_left(self._ends, kg[0]), bisect_right(self._starts, kg[1]))


def _input_segments(old: _OldSubtasks, i: int) -> list[RestoreSegment]:
    """The input channel state new subtask ``i`` of ``p`` replays, from the old subtasks ``old`` of the vertex."""
    if not old.rescaled:
        return [seg for pos in old.mapped(i) for seg in _segments(old.acks[pos], "input")]
    mine = key_group_range(i, old.maxp, old.p)
    same = old.same(i)
    candidates = {*old.mapped(i), *old.overlapping(mine), *([same] if same is not None else [])}
    out: list[RestoreSegment] = []
    for pos in sorted(candidates):
        a, theirs = old.acks[pos], old.ranges[pos]
        j = a.subtask_index
        for seg in _segments(a, "input", theirs):
            if seg.partitioning == Partitioning.hash:
                keep = _overlaps(theirs, mine)
            elif seg.partitioning == Partitioning.broadcast:
                keep = j == i
            else:
                keep = j % old.p == i
            if keep:
                out.append(seg)
    return out


def _operator_state(old: _OldSubtasks, blobs: dict[str, BlobRow], i: int, keyed: bool):
    """Slices of operator state for new subtask ``i``: keyed state from every old subtask whose key-group range
    overlaps (the subtask keeps its own key groups), the rest from the old subtasks that map to it."""
    mine = key_group_range(i, old.maxp, old.p)
    mapped = set(old.mapped(i))
    candidates = mapped | set(old.overlapping(mine)) if keyed else mapped
    out: list[RestoreState] = []
    for pos in sorted(candidates):
        a = old.acks[pos]
        overlapping = keyed and _overlaps(old.ranges[pos], mine)
        if a.operator_blob_id and (pos in mapped or overlapping):
            # key groups only where the slice holds some of this subtask's keyed state
            out.append(_state(a, blobs[a.operator_blob_id], mine[0], mine[1], overlapping))
    return out


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
        p, maxp = v["parallelism"], v["max_parallelism"]
        old = _OldSubtasks(sorted(by_vertex.get(v["id"], []), key=lambda a: a.subtask_index), p, maxp)
        positions = [
            SourcePosition(from_subtask=a.subtask_index, offsets=a.source_offsets)
            for a in old.acks
            if a.source_offsets
        ]
        for i in range(p):
            kg_start, kg_end = key_group_range(i, maxp, p)
            sub = SubtaskRestore(
                vertex=v["id"],
                subtask_index=i,
                key_group_start=kg_start,
                key_group_end=kg_end,
                operator_state=_operator_state(old, blobs, i, bool(v.get("keyed"))),
                input_channel_state=_input_segments(old, i),
                source_positions=positions,
            )
            for pos in old.mapped(i):
                sub.output_channel_state += _segments(old.acks[pos], "output")
            same = old.same(i)
            if same is not None and not old.rescaled:
                sub.source_offsets = old.acks[same].source_offsets
            subtasks.append(sub)
    return RestorePlan(
        job_id=job.id,
        checkpoint_id=cp.id,
        is_savepoint=cp.is_savepoint,
        **_requested(requested),
        fallbacks=fallbacks,
        rescaled=_rescaled(job, by_vertex),
        subtasks=subtasks,
    )


def _rescaled(job: JobRow, by_vertex: dict[str, list[AckRow]]) -> list[VertexRescale]:
    out = []
    for v in job.graph["vertices"]:
        old = by_vertex.get(v["id"], [])
        if not old or len(old) == v["parallelism"]:
            continue
        moved = sum(seg["length"] for a in old for seg in a.segments if seg["direction"] == "input")
        moved += sum(
            seg["length"]
            for acks in by_vertex.values()
            for a in acks
            for seg in a.segments
            if seg["direction"] == "output" and seg.get("peer_vertex") == v["id"]
        )
        out.append(
            VertexRescale(
                vertex=v["id"], old_parallelism=len(old), new_parallelism=v["parallelism"], channel_state_bytes=moved
            )
        )
    return out


def _state(a: AckRow, blob: BlobRow, kg_start: int, kg_end: int, keyed: bool) -> RestoreState:
    return RestoreState(
        blob_id=blob.id,
        sha256=blob.sha256,
        size=blob.size,
        from_subtask=a.subtask_index,
        key_group_start=max(kg_start, a.key_group_start) if keyed and a.key_group_start is not None else None,
        key_group_end=min(kg_end, a.key_group_end) if keyed and a.key_group_end is not None else None,
    )
