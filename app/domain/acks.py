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

from sqlalchemy import case, select, tuple_, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AckRow, BlobRow, CheckpointRow, JobRow
from app.domain.checkpoints import check_parallelism, complete_checkpoint, get_checkpoint_or_404
from app.domain.context import BackgroundWorker, Context, after_commit, now_ms
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


class AckCommitter(BackgroundWorker):
    name = "overtake-ack-committer"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.max_batch = ctx.settings.ack_batch_max
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._graphs: dict[tuple[int, int | None], dict[str, int]] = {}
        self._insert = pg_insert if ctx.db.is_sqlite is False else sqlite_insert

    async def submit(
        self, job_id: int, checkpoint_id: int, acks: list[SubtaskAck]
    ) -> list[AckResult | DomainError]:
        loop = asyncio.get_running_loop()
        items = [_Item(job_id, checkpoint_id, a, ack_hash(a), loop.create_future()) for a in acks]
        for it in items:
            self._queue.put_nowait(it)
        if len(items) == 1:
            return [await items[0].future]
        return list(await asyncio.gather(*(it.future for it in items)))

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            await asyncio.sleep(0)  # let acks that are already being handled join this batch
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
            # The job row lock (one lock order everywhere: job, then its checkpoints). Only the attempt is read:
            # the graph comes from a cache (graphs never change) and the full row is loaded only to complete.
            locked = (
                await s.execute(select(JobRow.current_attempt).where(JobRow.id == job_id).with_for_update())
            ).one_or_none()
            if locked is None:
                for it in items:
                    it.result = NotFound(f"job {job_id} does not exist")
                continue
            graph = await self._graph(s, job_id, locked[0])
            by_cp: dict[int, list[_Item]] = defaultdict(list)
            for it in items:
                by_cp[it.checkpoint_id].append(it)
            for cp_id, cp_items in by_cp.items():
                await self._apply_checkpoint(s, job_id, graph, cp_id, cp_items)

    async def _graph(self, s: AsyncSession, job_id: int, attempt: int | None) -> dict[str, int]:
        """vertex -> parallelism. A job's graph changes only when an attempt rescales it, so it is cached per attempt."""
        graph = self._graphs.get((job_id, attempt))
        if graph is None:
            job = await s.get(JobRow, job_id)
            graph = {v["id"]: v["parallelism"] for v in job.graph["vertices"]}
            if len(self._graphs) > 10_000:
                self._graphs.clear()
            self._graphs[(job_id, attempt)] = graph
        return graph

    async def _apply_checkpoint(
        self, s: AsyncSession, job_id: int, graph: dict[str, int], cp_id: int, items: list[_Item]
    ) -> None:
        cp = (
            await s.execute(
                select(
                    CheckpointRow.status,
                    CheckpointRow.attempt,
                    CheckpointRow.failure_reason,
                    CheckpointRow.num_subtasks,
                ).where(CheckpointRow.job_id == job_id, CheckpointRow.id == cp_id)
            )
        ).one_or_none()
        if cp is None:
            try:
                await get_checkpoint_or_404(s, job_id, cp_id)
            except NotFound as exc:
                for it in items:
                    it.result = exc
            return
        status, attempt, failure_reason, num_subtasks = cp
        blob_ids = {
            ref.blob_id
            for it in items
            for ref in (it.ack.operator_state, it.ack.channel_state)
            if ref is not None
        }
        blobs: dict[str, BlobRow] = {}
        if blob_ids:
            blobs = {
                b.id: b for b in (await s.execute(select(BlobRow).where(BlobRow.id.in_(blob_ids)))).scalars()
            }
        now = now_ms()
        candidates: dict[tuple[str, int], tuple[_Item, dict]] = {}
        repeats: list[_Item] = []  # a second ack for a subtask within this batch
        for it in items:
            a = it.ack
            key = (a.vertex, a.subtask_index)
            try:
                check_parallelism(job_id, graph, a.vertex, a.subtask_index)
                if key in candidates:
                    repeats.append(it)
                    continue
                if a.attempt != attempt:
                    raise Conflict(
                        f"checkpoint {cp_id} belongs to attempt {attempt}; this ack is from attempt {a.attempt}"
                    )
                if status == PENDING:  # blobs of a finished checkpoint may be released; only new acks need them
                    self._check_blobs(job_id, cp_id, a, blobs)
            except DomainError as exc:
                it.result = exc
                continue
            candidates[key] = (it, _row(job_id, cp_id, a, it.digest, now))
        inserted: set[tuple[str, int]] = set()
        if candidates and status == PENDING:
            stmt = (
                self._insert(AckRow).on_conflict_do_nothing().returning(AckRow.vertex, AckRow.subtask_index)
            )
            result = await s.execute(stmt, [row for _, row in candidates.values()])
            inserted = {(r[0], r[1]) for r in result}
        # Whatever was not inserted was acked before (or the checkpoint is over): the same ack again is a
        # duplicate and succeeds, also after an abort (it reports the status); a different one is a conflict.
        others = [k for k in candidates if k not in inserted] + [
            (it.ack.vertex, it.ack.subtask_index) for it in repeats if it.result is None
        ]
        existing: dict[tuple[str, int], str] = {}
        if others:
            existing = {
                (r[0], r[1]): r[2]
                for r in await s.execute(
                    select(AckRow.vertex, AckRow.subtask_index, AckRow.content_hash).where(
                        AckRow.job_id == job_id,
                        AckRow.checkpoint_id == cp_id,
                        tuple_(AckRow.vertex, AckRow.subtask_index).in_(others),
                    )
                )
            }
        duplicates: set[int] = set()
        for it in [c[0] for c in candidates.values()] + repeats:
            key = (it.ack.vertex, it.ack.subtask_index)
            if it.result is not None or (key in inserted and it is candidates[key][0]):
                continue
            prior = existing.get(key) or (candidates[key][1]["content_hash"] if key in inserted else None)
            if prior is None and status == ABORTED:
                it.result = Conflict(f"checkpoint {cp_id} was aborted ({failure_reason}); discard its state")
            elif prior is None:
                it.result = Conflict(
                    f"checkpoint {cp_id} is already {status} without an ack of {key[0]}[{key[1]}]"
                )
            elif prior != it.digest:
                it.result = Conflict(
                    f"subtask {key[0]}[{key[1]}] already acknowledged checkpoint {cp_id} "
                    "with different content; an ack cannot be changed"
                )
            else:
                duplicates.add(id(it))
        num_acked = None
        if inserted:
            rows = [candidates[k][1] for k in inserted]
            longest = max(r["alignment_duration"] for r in rows)
            num_acked = (
                await s.execute(
                    update(CheckpointRow)
                    .where(CheckpointRow.job_id == job_id, CheckpointRow.id == cp_id)
                    .values(
                        num_acked=CheckpointRow.num_acked + len(rows),
                        state_size=CheckpointRow.state_size + sum(r["state_size"] for r in rows),
                        persisted_data=CheckpointRow.persisted_data + sum(r["persisted_data"] for r in rows),
                        processed_data=CheckpointRow.processed_data + sum(r["processed_data"] for r in rows),
                        # NULL > x is unknown, so a first ack takes the batch's maximum.
                        alignment_duration=case(
                            (CheckpointRow.alignment_duration > longest, CheckpointRow.alignment_duration),
                            else_=longest,
                        ),
                        any_unaligned=CheckpointRow.any_unaligned | any(r["unaligned"] for r in rows),
                        latest_ack_ts=now,
                    )
                    .returning(CheckpointRow.num_acked)
                    .execution_options(synchronize_session=False)
                )
            ).scalar_one()
            if num_acked == num_subtasks:
                job = await s.get(JobRow, job_id)
                cp_row = await s.get(CheckpointRow, (job_id, cp_id), populate_existing=True)
                await complete_checkpoint(s, job, cp_row, now)
                status = COMPLETED
        if num_acked is None:
            num_acked = (
                await s.execute(
                    select(CheckpointRow.num_acked).where(
                        CheckpointRow.job_id == job_id, CheckpointRow.id == cp_id
                    )
                )
            ).scalar_one()
        recorded, dup = len(inserted), len(duplicates)
        refused = sum(1 for it in items if isinstance(it.result, DomainError))
        after_commit(
            s,
            lambda: (
                ACKS.labels("recorded").inc(recorded),
                ACKS.labels("duplicate").inc(dup),
                ACKS.labels("refused").inc(refused),
            ),
        )
        status_enum = CheckpointStatus(status)
        for it in items:
            if it.result is None:
                it.result = AckResult.model_construct(
                    checkpoint_id=cp_id,
                    vertex=it.ack.vertex,
                    subtask_index=it.ack.subtask_index,
                    status=status_enum,
                    num_acknowledged_subtasks=num_acked,
                    num_subtasks=num_subtasks,
                    duplicate=id(it) in duplicates,
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


def _row(job_id: int, cp_id: int, a: SubtaskAck, digest: str, now: int) -> dict:
    m = a.metrics
    return {
        "job_id": job_id,
        "checkpoint_id": cp_id,
        "vertex": a.vertex,
        "subtask_index": a.subtask_index,
        "attempt": a.attempt,
        "content_hash": digest,
        "ack_ts": now,
        "sync_duration": m.sync_duration,
        "async_duration": m.async_duration,
        "alignment_duration": m.alignment_duration,
        "start_delay": m.start_delay,
        "processed_data": m.processed_data,
        "persisted_data": m.persisted_data,
        "state_size": (a.operator_state.size if a.operator_state else 0)
        + (a.channel_state.size if a.channel_state else 0),
        "unaligned": m.unaligned,
        "operator_blob_id": a.operator_state.blob_id if a.operator_state else None,
        "channel_blob_id": a.channel_state.blob_id if a.channel_state else None,
        "segments": [seg.model_dump(mode="json") for seg in a.channel_segments],
        "source_offsets": a.source_offsets,
        "key_group_start": a.key_group_start,
        "key_group_end": a.key_group_end,
    }
