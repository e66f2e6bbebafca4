"""Acks with group commit: concurrent acks are recorded in one transaction (protocol step 4/5).

Every ack of a checkpoint updates the same checkpoint row, so a transaction per ack serializes on
that row and on the commit's fsync. The committer instead drains whatever acks are waiting, records
them all in one transaction under the job row lock, and answers each only after that commit: an
ack is acknowledged only once it is durable. While one batch commits, the next one gathers.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import insert, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AckRow, BlobRow, JobRow
from app.domain.checkpoints import check_subtask, complete_checkpoint, get_checkpoint_or_404
from app.domain.context import Context, after_commit, lock_job, now_ms
from app.domain.lifecycle import ABORTED, COMPLETED, PENDING
from app.errors import Conflict, DomainError, Invalid, NotFound
from app.observability import ACK_BATCH, ACKS
from client.models import AckResult, CheckpointStatus, SubtaskAck

log = logging.getLogger(__name__)


def ack_hash(ack: SubtaskAck) -> str:
    """The ack's identity for idempotency: its canonical JSON (fields in model order), hashed."""
    return hashlib.sha256(ack.model_dump_json().encode()).hexdigest()


@dataclass
class _Item:
    job_id: int
    checkpoint_id: int
    ack: SubtaskAck
    digest: str
    future: asyncio.Future = field(repr=False)
    result: AckResult | DomainError | None = None


class AckCommitter:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.max_batch = ctx.settings.ack_batch_max
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="overtake-ack-committer")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def submit(self, job_id: int, checkpoint_id: int, acks: list[SubtaskAck]) -> list[AckResult | DomainError]:
        loop = asyncio.get_running_loop()
        items = [_Item(job_id, checkpoint_id, a, ack_hash(a), loop.create_future()) for a in acks]
        for it in items:
            self._queue.put_nowait(it)
        return list(await asyncio.gather(*(it.future for it in items)))

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await self._commit(batch)
            except Exception:  # noqa: BLE001 - never let the committer die
                log.exception("ack batch of %d failed", len(batch))
                for it in batch:
                    if not it.future.done():
                        it.future.set_exception(RuntimeError("the ack could not be recorded; retry"))

    async def _commit(self, batch: list[_Item]) -> None:
        try:
            async with self.ctx.tx() as s:
                await self._apply(s, batch)
        except Exception as exc:
            if len(batch) == 1:
                it = batch[0]
                if not it.future.done():
                    if isinstance(exc, DomainError):
                        it.future.set_result(exc)
                    else:
                        it.future.set_exception(exc)
                return
            # One bad item must not fail its neighbours: record them one by one.
            log.warning("ack batch of %d failed (%s); retrying one by one", len(batch), exc)
            for it in batch:
                it.result = None
                await self._commit([it])
            return
        ACK_BATCH.observe(len(batch))
        for it in batch:
            if not it.future.done():
                it.future.set_result(it.result)

    async def _apply(self, s: AsyncSession, batch: list[_Item]) -> None:
        by_job: dict[int, list[_Item]] = defaultdict(list)
        for it in batch:
            by_job[it.job_id].append(it)
        for job_id, items in by_job.items():
            job = await lock_job(s, job_id)
            if job is None:
                for it in items:
                    it.result = NotFound(f"job {job_id} does not exist")
                continue
            by_cp: dict[int, list[_Item]] = defaultdict(list)
            for it in items:
                by_cp[it.checkpoint_id].append(it)
            for cp_id, cp_items in by_cp.items():
                await self._apply_checkpoint(s, job, cp_id, cp_items)

    async def _apply_checkpoint(self, s: AsyncSession, job: JobRow, cp_id: int, items: list[_Item]) -> None:
        try:
            cp = await get_checkpoint_or_404(s, job.id, cp_id)
        except NotFound as exc:
            for it in items:
                it.result = exc
            return
        keys = [(it.ack.vertex, it.ack.subtask_index) for it in items]
        existing: dict[tuple[str, int], str] = {
            (r[0], r[1]): r[2]
            for r in await s.execute(
                select(AckRow.vertex, AckRow.subtask_index, AckRow.content_hash).where(
                    AckRow.job_id == job.id,
                    AckRow.checkpoint_id == cp_id,
                    tuple_(AckRow.vertex, AckRow.subtask_index).in_(keys),
                )
            )
        }
        blob_ids = {
            ref.blob_id for it in items for ref in (it.ack.operator_state, it.ack.channel_state) if ref is not None
        }
        blobs: dict[str, BlobRow] = {}
        if blob_ids:
            blobs = {b.id: b for b in (await s.execute(select(BlobRow).where(BlobRow.id.in_(blob_ids)))).scalars()}
        now = now_ms()
        rows: list[dict] = []
        duplicates: set[int] = set()
        for n, it in enumerate(items):
            a = it.ack
            key = (a.vertex, a.subtask_index)
            try:
                check_subtask(job, a.vertex, a.subtask_index)
                if key in existing:
                    if existing[key] != it.digest:
                        raise Conflict(
                            f"subtask {a.vertex}[{a.subtask_index}] already acknowledged checkpoint {cp_id} "
                            "with different content; an ack cannot be changed"
                        )
                    duplicates.add(n)
                    continue
                if cp.status == ABORTED:
                    raise Conflict(f"checkpoint {cp_id} was aborted ({cp.failure_reason}); discard its state")
                if cp.status == COMPLETED:
                    raise Conflict(f"checkpoint {cp_id} is already COMPLETED without this ack")
                if a.attempt != cp.attempt:
                    raise Conflict(
                        f"checkpoint {cp_id} belongs to attempt {cp.attempt}; this ack is from attempt {a.attempt}"
                    )
                self._check_blobs(job.id, cp_id, a, blobs)
            except DomainError as exc:
                it.result = exc
                continue
            existing[key] = it.digest
            m = a.metrics
            state_size = (a.operator_state.size if a.operator_state else 0) + (
                a.channel_state.size if a.channel_state else 0
            )
            rows.append(
                {
                    "job_id": job.id,
                    "checkpoint_id": cp_id,
                    "vertex": a.vertex,
                    "subtask_index": a.subtask_index,
                    "attempt": a.attempt,
                    "content_hash": it.digest,
                    "ack_ts": now,
                    "sync_duration": m.sync_duration,
                    "async_duration": m.async_duration,
                    "alignment_duration": m.alignment_duration,
                    "start_delay": m.start_delay,
                    "processed_data": m.processed_data,
                    "persisted_data": m.persisted_data,
                    "state_size": state_size,
                    "unaligned": m.unaligned,
                    "operator_blob_id": a.operator_state.blob_id if a.operator_state else None,
                    "channel_blob_id": a.channel_state.blob_id if a.channel_state else None,
                    "segments": [seg.model_dump(mode="json") for seg in a.channel_segments],
                    "source_offsets": a.source_offsets,
                    "key_group_start": a.key_group_start,
                    "key_group_end": a.key_group_end,
                }
            )
            cp.num_acked += 1
            cp.state_size += state_size
            cp.persisted_data += m.persisted_data
            cp.processed_data += m.processed_data
            cp.alignment_duration = max(cp.alignment_duration or 0, m.alignment_duration)
            cp.any_unaligned = cp.any_unaligned or m.unaligned
            cp.latest_ack_ts = now
        if rows:
            await s.execute(insert(AckRow), rows)
            if cp.num_acked == cp.num_subtasks and cp.status == PENDING:
                await complete_checkpoint(s, job, cp, now)
        recorded, dup = len(rows), len(duplicates)
        refused = sum(1 for it in items if isinstance(it.result, DomainError))
        after_commit(
            s,
            lambda: (
                ACKS.labels("recorded").inc(recorded),
                ACKS.labels("duplicate").inc(dup),
                ACKS.labels("refused").inc(refused),
            ),
        )
        for n, it in enumerate(items):
            if it.result is None:
                it.result = AckResult(
                    checkpoint_id=cp_id,
                    vertex=it.ack.vertex,
                    subtask_index=it.ack.subtask_index,
                    status=CheckpointStatus(cp.status),
                    num_acknowledged_subtasks=cp.num_acked,
                    num_subtasks=cp.num_subtasks,
                    duplicate=n in duplicates,
                )

    @staticmethod
    def _check_blobs(job_id: int, cp_id: int, a: SubtaskAck, blobs: dict[str, BlobRow]) -> None:
        for kind, ref in (("operator", a.operator_state), ("channel", a.channel_state)):
            if ref is None:
                continue
            b = blobs.get(ref.blob_id)
            where = f"checkpoint {cp_id} subtask {a.vertex}[{a.subtask_index}]"
            if b is None or b.status != "stored":
                raise Invalid(f"{kind} blob {ref.blob_id} is not stored; upload it for {where} before acking")
            if (b.job_id, b.checkpoint_id, b.vertex, b.subtask_index, b.kind) != (
                job_id,
                cp_id,
                a.vertex,
                a.subtask_index,
                kind,
            ):
                raise Invalid(
                    f"{kind} blob {ref.blob_id} was uploaded for checkpoint {b.checkpoint_id} subtask "
                    f"{b.vertex}[{b.subtask_index}] ({b.kind}), not for {where}"
                )
            if b.sha256 != ref.sha256.lower() or b.size != ref.size:
                raise Invalid(
                    f"{kind} blob {ref.blob_id} is stored with sha256 {b.sha256} and size {b.size}; "
                    f"the ack says {ref.sha256} and {ref.size}"
                )

