"""Uploads and downloads of state blobs: verified before they are stored, idempotent per subtask slot; where each
blob lies (its object and offset); reports of corrupt blobs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Literal

from sqlalchemy import delete, or_, select
from sqlalchemy.exc import IntegrityError

from app.blobstore import Staged, blob_key, new_blob_id, store_answers, upload_key
from app.db.models import AckRow, BlobRow, CheckpointRow
from app.domain import lifecycle
from app.domain.checkpoints import check_subtask, get_checkpoint_or_404
from app.domain.context import Context, after_commit, get_job_or_404, now_ms
from app.domain.lifecycle import SubtaskRequest, belongs_to_attempt, check_current_attempt
from app.errors import Conflict, Invalid, NotFound, RangeNotSatisfiable
from app.observability import BLOB_BYTES
from contract.models import BlobInfo, CorruptBlob

Kind = Literal["operator", "channel"]
log = logging.getLogger(__name__)


def blob_info(b: BlobRow) -> BlobInfo:
    return BlobInfo(
        blob_id=b.id,
        job_id=b.job_id,
        checkpoint_id=b.checkpoint_id,
        vertex=b.vertex,
        subtask_index=b.subtask_index,
        kind=b.kind,
        sha256=b.sha256,
        size=b.size,
        created_at=b.created_at,
        corrupt=b.corrupt,
    )


def object_of(b: BlobRow) -> tuple[str, int]:
    """The key of the object holding the blob, and where the blob starts in it."""
    if b.key is None:  # stored before the per-checkpoint layout: the whole object
        return blob_key(b.job_id, b.id), 0
    return b.key, b.offset


async def _existing(
    ctx: Context, job_id: int, cp_id: int, vertex: str, index: int
) -> tuple[CheckpointRow, dict[str, BlobRow]]:
    """The checkpoint and the blobs of the subtask's slot as they are now (after a concurrent upload won it)."""
    async with ctx.tx(readonly=True) as s:
        return await get_checkpoint_or_404(s, job_id, cp_id), await _slot(s, job_id, cp_id, vertex, index)


async def _slot(s, job_id: int, cp_id: int, vertex: str, index: int) -> dict[str, BlobRow]:
    """The blobs already stored for this subtask of this checkpoint, by kind."""
    rows = await s.execute(
        select(BlobRow).where(
            BlobRow.job_id == job_id,
            BlobRow.checkpoint_id == cp_id,
            BlobRow.vertex == vertex,
            BlobRow.subtask_index == index,
        )
    )
    return {b.kind: b for b in rows.scalars()}


async def _acked(s, job_id: int, cp_id: int, vertex: str, index: int) -> bool:
    """Whether the subtask's ack of this checkpoint is recorded."""
    found = await s.execute(
        select(AckRow.subtask_index).where(
            AckRow.job_id == job_id,
            AckRow.checkpoint_id == cp_id,
            AckRow.vertex == vertex,
            AckRow.subtask_index == index,
        )
    )
    return found.first() is not None


def _same_or_conflict(
    cp: CheckpointRow, b: BlobRow, staged: Staged, attempt: int, vertex: str, index: int
) -> BlobInfo:
    same = b.sha256 == staged.sha256 and b.size == staged.size
    if same and b.status != "stored":
        raise Conflict(
            f"the {b.kind} blob of subtask {vertex}[{index}] for checkpoint {cp.id} was released "
            f"(the checkpoint is {cp.status}" + (f": {cp.failure_reason}" if cp.failure_reason else "") + "); discard its state"
        )
    request = SubtaskRequest("upload", attempt, f"{vertex}[{index}]", "same" if same else "different")
    try:
        lifecycle.accept(cp, request)
    except Conflict as exc:
        if same:
            raise
        raise Conflict(
            f"{exc.message} (the stored {b.kind} blob has sha256 {b.sha256} and {b.size} bytes)"
        ) from None
    return blob_info(b)


def _check_open(cp: CheckpointRow, attempt: int, vertex: str, index: int) -> None:
    """A new blob is stored only for a checkpoint that takes uploads from this attempt."""
    lifecycle.accept(cp, SubtaskRequest("upload", attempt, f"{vertex}[{index}]"))


async def upload(
    ctx: Context,
    job_id: int,
    cp_id: int,
    attempt: int,
    vertex: str,
    index: int,
    kind: Kind,
    sha256: str,
    body: AsyncIterator[bytes],
) -> tuple[BlobInfo, bool]:
    """Store a blob. Returns (info, created). Nothing is stored unless the sha256 matches and the slot is free."""
    ((info, created),) = await store(ctx, job_id, cp_id, attempt, vertex, index, [(kind, sha256, body)])
    return info, created


async def store(
    ctx: Context,
    job_id: int,
    cp_id: int,
    attempt: int,
    vertex: str,
    index: int,
    parts: list[tuple[Kind, str, AsyncIterator[bytes]]],
    from_report: bool = False,
) -> list[tuple[BlobInfo, bool]]:
    """Store one subtask's blobs of a checkpoint (at most one per kind) together: one read to check the
    checkpoint and the slot, each part staged and verified against its sha256, the new ones moved into the
    store in parallel, and one transaction recording them all. Returns (info, created) per part, in order.

    `from_report`: the digests come from an `acks/with-state` report (the messages say so), not the header.
    All or nothing: a part that fails its check, or conflicts with a blob stored before, stores none of them.
    The same parts again (a retry) return the stored blobs with created=False and change nothing.
    """
    kinds = [kind for kind, _, _ in parts]
    if len(set(kinds)) != len(kinds):
        raise Invalid(f"at most one blob of each kind per request, got {kinds}")
    await ctx.cleaner.ensure_claimed()  # nothing into a store another deployment holds
    async with ctx.tx(readonly=True) as s:
        job = await get_job_or_404(s, job_id)
        cp = await get_checkpoint_or_404(s, job_id, cp_id)
        check_subtask(job, vertex, index)
        prior = await _slot(s, job_id, cp_id, vertex, index)
        acked = any(kind not in prior for kind in kinds) and await _acked(s, job_id, cp_id, vertex, index)
    if any(kind not in prior for kind in kinds):
        _check_open(cp, attempt, vertex, index)  # only a retry of what is stored already may come after completion
        if acked:
            raise Conflict(
                f"subtask {vertex}[{index}] already sent an ack for checkpoint {cp_id}, which names no such blob; a "
                "blob uploaded now could never be named by it; nothing was stored"
            )
    else:
        belongs_to_attempt(attempt, cp.attempt, f"checkpoint {cp_id}", "this upload")
    staged: list[Staged] = []
    try:
        for kind, sha256, body in parts:
            said_by = f"the report's {kind}_state.sha256" if from_report else "X-Overtake-Sha256"
            staged.append(await ctx.store.stage(body, sha256, ctx.settings.max_blob_size, said_by))
        answers: list[tuple[BlobInfo, bool] | None] = []
        for kind, st in zip(kinds, staged, strict=True):
            answers.append(
                (_same_or_conflict(cp, prior[kind], st, attempt, vertex, index), False) if kind in prior else None
            )
        new = [i for i, a in enumerate(answers) if a is None]
        if not new:
            return [a for a in answers if a is not None]
        keys = {i: upload_key(job_id, cp_id, new_blob_id()) for i in new}
        try:
            moved = await asyncio.gather(*(ctx.store.commit(staged[i], keys[i]) for i in new), return_exceptions=True)
            for m in moved:
                if isinstance(m, BaseException):
                    async with store_answers("when the upload was stored"):
                        raise m
            async with ctx.tx() as s:
                # Share-lock the checkpoint so an abort cannot slip between this check and the insert. (Its row is
                # not `cp`: a failed insert rolls this session back and leaves its rows expired and detached.)
                locked = (
                    await s.execute(
                        select(CheckpointRow)
                        .where(CheckpointRow.job_id == job_id, CheckpointRow.id == cp_id)
                        .with_for_update(read=True)
                    )
                ).scalar_one()
                _check_open(locked, attempt, vertex, index)
                created_at = now_ms()
                for i in new:
                    row = BlobRow(
                        id=keys[i].rsplit("/", 1)[1],
                        job_id=job_id,
                        checkpoint_id=cp_id,
                        vertex=vertex,
                        subtask_index=index,
                        kind=kinds[i],
                        attempt=attempt,
                        sha256=staged[i].sha256,
                        size=staged[i].size,
                        status="stored",
                        created_at=created_at,
                        key=keys[i],
                        offset=0,
                    )
                    s.add(row)
                    answers[i] = (blob_info(row), True)
                await s.flush()
                size = sum(staged[i].size for i in new)
                after_commit(s, lambda: BLOB_BYTES.inc(size))
            return [a for a in answers if a is not None]
        except BaseException as exc:
            for i in new:
                try:
                    await ctx.store.delete(keys[i])
                except Exception as gone:  # noqa: BLE001 - under the checkpoint's prefix, no row: the sweep collects it
                    log.warning("could not delete %s after a failed upload (the sweep collects it): %s", keys[i], gone)
            if isinstance(exc, Conflict) and isinstance(exc.__cause__, IntegrityError):
                # A concurrent identical upload won the slot: answer as for a retry.
                now_cp, won = await _existing(ctx, job_id, cp_id, vertex, index)
                if all(k in won for k in kinds):
                    return [
                        (_same_or_conflict(now_cp, won[k], st, attempt, vertex, index), False)
                        for k, st in zip(kinds, staged, strict=True)
                    ]
            raise
    finally:
        for st in staged:
            st.discard()


async def discard_unacked(ctx: Context, job_id: int, cp_id: int, blob_ids: list[str]) -> None:
    """The ack that was to name these blobs (just stored for it, `acks/with-state`) was refused: delete those no
    ack names, rows and objects, so the refused request leaves nothing and the subtask's slot is free for the state
    it sends next. A blob an ack names (a concurrent identical report's, committed) stays. Should this fail, the
    sweep collects them with their checkpoint's prefix, as any blob no ack names."""
    if not blob_ids:
        return
    named = (
        select(AckRow.subtask_index)
        .where(
            AckRow.job_id == job_id,
            AckRow.checkpoint_id == cp_id,
            or_(AckRow.operator_blob_id == BlobRow.id, AckRow.channel_blob_id == BlobRow.id),
        )
        .exists()
    )
    try:
        async with ctx.tx() as s:
            await get_job_or_404(s, job_id, lock=True)  # acks are recorded under it: none can name them meanwhile
            doomed = list(
                (await s.execute(select(BlobRow).where(BlobRow.id.in_(blob_ids), BlobRow.job_id == job_id, ~named)))
                .scalars()
            )
            if doomed:
                await s.execute(delete(BlobRow).where(BlobRow.id.in_([b.id for b in doomed])))
        for b in doomed:
            await ctx.store.delete(object_of(b)[0])
    except Exception as exc:  # noqa: BLE001 - the refusal is the answer; the sweep collects what is left
        log.warning("could not delete the blobs of a refused report for checkpoint %s of job %s: %s", cp_id, job_id, exc)


def _check_blob_id(blob_id: str) -> None:
    blob_key(1, blob_id)  # refuses anything that is not an issued id


async def _stored_row(s, job_id: int, blob_id: str) -> BlobRow:
    await get_job_or_404(s, job_id)
    row = await s.get(BlobRow, blob_id)
    if row is None or row.job_id != job_id or row.status != "stored":
        raise NotFound(
            f"job {job_id} has no blob {blob_id}"
            + (" (it was released)" if row is not None and row.job_id == job_id else "")
        )
    return row


async def open_blob(ctx: Context, job_id: int, blob_id: str) -> BlobRow:
    """The row of a stored blob whose object is in the store (404 otherwise); read it at `object_of(row)`."""
    _check_blob_id(blob_id)
    async with ctx.tx(readonly=True) as s:
        row = await _stored_row(s, job_id, blob_id)
    key, offset = object_of(row)
    async with store_answers(f"whether object {key} of blob {blob_id} is there"):
        size = await ctx.store.size(key)
    if size is None or size < offset + row.size:
        raise NotFound(
            f"blob {blob_id} of job {job_id} is recorded but "
            + ("missing from the blob store" if size is None else f"its object {key} is cut short ({size} bytes)")
        )
    return row


async def mark_corrupt(ctx: Context, job_id: int, blob_id: str, report: CorruptBlob) -> BlobInfo:
    """A restoring subtask of the current attempt read the blob and its bytes do not match its sha256: mark it,
    so no restore plan uses its checkpoint again. Idempotent: a blob marked before stays marked as first reported."""
    _check_blob_id(blob_id)
    async with ctx.tx() as s:
        job = await get_job_or_404(s, job_id, lock=True)
        check_current_attempt(job, report.attempt, "this corrupt-blob report")
        check_subtask(job, report.vertex, report.subtask_index)
        row = await _stored_row(s, job_id, blob_id)
        if row.corrupt is None:
            row.corrupt = (
                f"reported corrupt by subtask {report.vertex}[{report.subtask_index}] of attempt {report.attempt}: "
                f"{report.reason}"
            )
        return blob_info(row)


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """Parse a single `bytes=a-b`, `bytes=a-` or `bytes=-n` range (inclusive), or None for the whole blob."""
    if not header:
        return None
    unit, _, spec = header.partition("=")
    if unit.strip() != "bytes" or "," in spec:
        raise RangeNotSatisfiable(f"unsupported Range {header!r}: use a single 'bytes=start-end' range")
    first, _, last = spec.strip().partition("-")
    try:
        if first == "":
            n = int(last)
            if n <= 0:
                raise ValueError
            start, end = max(0, size - n), size - 1
        else:
            start = int(first)
            end = int(last) if last else size - 1
    except ValueError:
        raise RangeNotSatisfiable(f"malformed Range {header!r}: use 'bytes=start-end'") from None
    end = min(end, size - 1)
    if start > end or start >= size:
        raise RangeNotSatisfiable(
            f"Range {header!r} is outside the blob's {size} bytes", details={"size": size}
        )
    return start, end
