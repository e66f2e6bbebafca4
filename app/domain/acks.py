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
import random
import time
from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import BigInteger, Boolean, Integer, bindparam, case, insert, select, tuple_, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AckRow, BlobRow, ChannelStateRefRow, CheckpointRow, JobRow
from app.db.session import TransientDatabaseError
from app.domain import cleanup, lifecycle, written
from app.domain.checkpoints import (
    OLDER_PENDING,
    check_parallelism,
    complete_checkpoint,
    get_checkpoint_or_404,
)
from app.domain.context import BackgroundWorker, Context, after_commit, now_ms
from app.domain.jobs import token_refusal
from app.domain.lifecycle import COMPLETED, PENDING, Prior, SubtaskRequest, Verdict, belongs_to_attempt
from app.errors import Conflict, DomainError, Invalid, NotFound, Unauthorized
from app.observability import ACK_BATCH, ACK_COMMIT_SECONDS, ACKS
from contract.models import MAX_PARALLELISM, AckResult, CheckpointStatus, SubtaskAck

log = logging.getLogger(__name__)
LINGER = 0.003  # seconds an ack batch waits at most for acks that are arriving


def ack_hash(ack: SubtaskAck) -> str:
    """The ack's identity for idempotency: its canonical JSON (fields in model order), hashed."""
    return hashlib.sha256(ack.model_dump_json().encode()).hexdigest()


# The hot path's statements, built once (building SQL expressions costs more than running them) and run on the
# session's connection as Core statements with bound parameters.
_JOBS, _CHECKPOINTS, _ACKS, _BLOBS = JobRow.__table__, CheckpointRow.__table__, AckRow.__table__, BlobRow.__table__
_JOB, _CP = bindparam("b_job"), bindparam("b_cp")
_LOCK_JOB = select(_JOBS.c.current_attempt, _JOBS.c.status).where(_JOBS.c.id == _JOB).with_for_update()
_THIS_CP = (_CHECKPOINTS.c.job_id == _JOB) & (_CHECKPOINTS.c.id == _CP)
_CHECKPOINT_FACTS = select(
    _CHECKPOINTS.c.status,
    _CHECKPOINTS.c.attempt,
    _CHECKPOINTS.c.failure_reason,
    _CHECKPOINTS.c.num_subtasks,
    _CHECKPOINTS.c.num_acked,
    _CHECKPOINTS.c.is_savepoint,
).where(_THIS_CP)
# The job row's lock with the checkpoint's facts, in one round trip. The checkpoint's row is locked too (after the
# job's: one lock order): a row read without its lock is read as of the statement's start, so after a wait for the
# job row's lock it would still show a checkpoint pending that the transaction holding the lock aborted (a
# replica's scheduler expiring it, a newer checkpoint subsuming it, a new attempt), and an ack would be recorded
# into an aborted checkpoint. A locked row is read as that transaction left it. No row: the checkpoint (or the
# job) does not exist, and `_LOCK_JOB` takes the lock alone.
_LOCK_JOB_WITH_CP = (
    select(
        _JOBS.c.current_attempt,
        _JOBS.c.status,
        _CHECKPOINTS.c.status,
        _CHECKPOINTS.c.attempt,
        _CHECKPOINTS.c.failure_reason,
        _CHECKPOINTS.c.num_subtasks,
        _CHECKPOINTS.c.num_acked,
        _CHECKPOINTS.c.is_savepoint,
    )
    .select_from(_JOBS.join(_CHECKPOINTS, (_CHECKPOINTS.c.job_id == _JOBS.c.id) & (_CHECKPOINTS.c.id == _CP)))
    .where(_JOBS.c.id == _JOB)
    .with_for_update(of=[_JOBS, _CHECKPOINTS])
)
_NUM_ACKED = select(_CHECKPOINTS.c.num_acked).where(_THIS_CP)
# The job and checkpoint rows a completing ack loads (the checkpoint's reloaded: `_ADD_ACKS` changed it), with whether
# older checkpoints are pending (to subsume) and whether the job has channel state references (to keep).
_COMPLETING = (
    select(JobRow, CheckpointRow, OLDER_PENDING, cleanup.any_reference(JobRow.id))
    .join(CheckpointRow, CheckpointRow.job_id == JobRow.id)
    .where(JobRow.id == _JOB, CheckpointRow.id == _CP)
    .execution_options(populate_existing=True)
)
# The same rows, loaded with the locks when the batch will likely complete the checkpoint: the job row's lock and
# the checkpoint's row lock in one round trip. Both rows are locked (FOR UPDATE OF both), so after a wait for
# another transaction's lock they are read as that transaction left them, not as of the statement's start.
_LOCK_COMPLETING = (
    select(JobRow, CheckpointRow, OLDER_PENDING, cleanup.any_reference(JobRow.id))
    .join(CheckpointRow, CheckpointRow.job_id == JobRow.id)
    .where(JobRow.id == _JOB, CheckpointRow.id == _CP)
    .with_for_update(of=[JobRow, CheckpointRow])
    .execution_options(populate_existing=True)
)
_LONGEST = bindparam("b_longest", type_=BigInteger)
_ADD_ACKS = (
    update(_CHECKPOINTS)
    .where(_THIS_CP)
    .values(
        num_acked=_CHECKPOINTS.c.num_acked + bindparam("b_acked", type_=Integer),
        state_size=_CHECKPOINTS.c.state_size + bindparam("b_state", type_=BigInteger),
        persisted_data=_CHECKPOINTS.c.persisted_data + bindparam("b_persisted", type_=BigInteger),
        processed_data=_CHECKPOINTS.c.processed_data + bindparam("b_processed", type_=BigInteger),
        # NULL > x is unknown, so a first ack takes the batch's maximum.
        alignment_duration=case(
            (_CHECKPOINTS.c.alignment_duration > _LONGEST, _CHECKPOINTS.c.alignment_duration), else_=_LONGEST
        ),
        any_unaligned=_CHECKPOINTS.c.any_unaligned | bindparam("b_unaligned", type_=Boolean),
        latest_ack_ts=bindparam("b_now", type_=BigInteger),
    )
    .returning(_CHECKPOINTS.c.num_acked)
)


@dataclass
class _Item:
    job_id: int
    checkpoint_id: int
    ack: SubtaskAck
    digest: str
    token_attempt: int | None  # the attempt of the task token it came with (None: admin, or no auth)
    future: asyncio.Future = field(repr=False)
    missing: DomainError | None = None  # its written object is not in the store as it says (`written.check`)
    together: bool = False  # submitted with others (a relay's batch request): they were gathered already
    result: AckResult | DomainError | None = None


class AckCommitter(BackgroundWorker):
    name = "overtake-ack-committer"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.max_batch = ctx.settings.ack_batch_max
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._graphs: dict[tuple[int, int | None], dict[str, int]] = {}
        self._key_groups: dict[tuple[int, int | None], dict[str, int]] = {}  # vertex -> max_parallelism
        self._subtasks: dict[int, int] = {}  # job -> its subtasks, as last seen (a hint: a rescale changes it)
        self._recorded: dict[tuple[int, int], int] = {}  # (job, checkpoint) -> acks this committer recorded for it
        insert = sqlite_insert if ctx.db.is_sqlite else pg_insert
        self._insert_acks = insert(_ACKS).on_conflict_do_nothing().returning(_ACKS.c.vertex, _ACKS.c.subtask_index)
        self._insert_blobs = insert(_BLOBS).on_conflict_do_nothing().returning(_BLOBS.c.id)

    async def submit(
        self,
        job_id: int,
        checkpoint_id: int,
        acks: list[SubtaskAck],
        token_attempt: int | None = None,
        missing: list[DomainError | None] | None = None,
    ) -> list[AckResult | DomainError]:
        """Record acks; each answer comes after its commit. `token_attempt`: the attempt whose task token sent
        them, checked under the job row lock (a token works only while its attempt is current). `missing`: per
        ack, why the object it wrote is not in the store as it says (`written.check`, done before submitting)."""
        loop = asyncio.get_running_loop()
        items = [_Item(job_id, checkpoint_id, a, ack_hash(a), token_attempt, loop.create_future()) for a in acks]
        if missing is not None:
            for it, problem in zip(items, missing, strict=True):
                it.missing = problem
        for it in items:
            it.together = len(items) > 1
            self._queue.put_nowait(it)
        if len(items) == 1:
            return [await items[0].future]
        return list(await asyncio.gather(*(it.future for it in items)))

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            if not batch[0].together:
                await self._gather()
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await self._commit(batch)
            except Exception:  # noqa: BLE001 - never let the committer die
                log.exception("ack batch of %d failed", len(batch))
                for it in batch:
                    if not it.future.done():
                        it.future.set_exception(RuntimeError("the ack could not be recorded; retry"))

    async def _gather(self) -> None:
        """Let acks already on their way join the batch: yield to the event loop while more keep arriving (the
        requests being read and parsed right now), at most `LINGER` seconds. A lone ack waits for nothing, and
        acks that came together (a host relay's batch) do not wait either: they were gathered where they came from,
        and whatever arrives meanwhile goes into the next transaction."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LINGER
        size, idle = self._queue.qsize(), 0
        while idle < 6 and loop.time() < deadline:
            await asyncio.sleep(0)
            if self._queue.qsize() > size:
                size, idle = self._queue.qsize(), 0
            else:
                idle += 1

    async def _commit(self, batch: list[_Item]) -> None:
        try:
            began = time.perf_counter()
            await self._apply_retrying(batch)
            ACK_COMMIT_SECONDS.observe(time.perf_counter() - began)
        except Exception as exc:
            if isinstance(exc, TransientDatabaseError):
                # the database, not an item, failed (and was tried again already): every ack is answered 503 now;
                # one by one, each would meet the outage again, holding up the acks that queue behind the batch
                unavailable = exc.unavailable()
                for it in batch:
                    if not it.future.done():
                        it.future.set_result(unavailable)
                return
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

    async def _apply_retrying(self, batch: list[_Item]) -> None:
        """One transaction for the batch; run again (a bounded number of times) after a transient failure."""
        retries = self.ctx.settings.db_retries
        for attempt in range(retries + 1):
            for it in batch:
                it.result = None
            try:
                # subsumed and collected checkpoints' prefixes are cleaned in the background: the answers wait for
                # the commit only
                async with self.ctx.tx(defer_cleanup=True) as s:
                    await self._apply(s, batch)
                return
            except TransientDatabaseError as exc:
                if attempt == retries:
                    raise
                log.info("ack batch of %d failed transiently (%s); running it again", len(batch), exc)
                await asyncio.sleep(random.uniform(0.005, 0.02) * 2**attempt)

    async def _apply(self, s: AsyncSession, batch: list[_Item]) -> None:
        by_job: dict[int, list[_Item]] = defaultdict(list)
        for it in batch:
            by_job[it.job_id].append(it)
        # Job rows are locked in one global order (by id), so two replicas' batches never wait for each other in
        # a cycle; then, per job, its checkpoints.
        for job_id, items in sorted(by_job.items()):
            # The job row lock (one lock order everywhere: job, then its checkpoints). Only the attempt is read
            # (the graph comes from a cache: graphs never change), unless the batch will likely complete the
            # checkpoint: then the full rows completing needs come with the locks.
            conn = await s.connection()
            cp_ids = {it.checkpoint_id for it in items}
            facts: tuple | None = None
            preloaded: tuple | None = None
            locked = None
            if len(cp_ids) == 1 and self._likely_completes(job_id, items):
                # the rows completing needs, with the locks: one round trip less for the batch that completes
                (cp_id,) = cp_ids
                preloaded = (await s.execute(_LOCK_COMPLETING, {"b_job": job_id, "b_cp": cp_id})).one_or_none()
                if preloaded is not None:
                    job, cp = preloaded[0], preloaded[1]
                    locked = (job.current_attempt, job.status)
                    facts = (
                        cp.status, cp.attempt, cp.failure_reason, cp.num_subtasks, cp.num_acked, cp.is_savepoint
                    )
            if locked is None and len(cp_ids) == 1:
                # the usual case: the locks and the checkpoint's state in one round trip
                (cp_id,) = cp_ids
                row = (await conn.execute(_LOCK_JOB_WITH_CP, {"b_job": job_id, "b_cp": cp_id})).one_or_none()
                if row is not None:
                    locked, facts = tuple(row[:2]), tuple(row[2:])
            if locked is None:
                # several checkpoints, or one that does not exist: the job row's lock alone; each checkpoint's facts
                # are read after it
                locked = (await conn.execute(_LOCK_JOB, {"b_job": job_id})).one_or_none()
            if locked is None:
                for it in items:
                    it.result = NotFound(f"job {job_id} does not exist")
                continue
            admitted = []
            for it in items:
                refusal = None
                if it.token_attempt is not None:
                    refusal = token_refusal(job_id, it.token_attempt, locked[0], locked[1])
                if refusal is None:
                    admitted.append(it)
                else:
                    it.result = Unauthorized(refusal)
            items = admitted
            graph = await self._graph(s, job_id, locked[0])
            key_groups = self._key_groups[(job_id, locked[0])]
            by_cp: dict[int, list[_Item]] = defaultdict(list)
            for it in items:
                by_cp[it.checkpoint_id].append(it)
            self._subtasks[job_id] = sum(graph.values())
            for cp_id, cp_items in by_cp.items():
                await self._apply_checkpoint(s, job_id, graph, cp_id, cp_items, facts, preloaded, key_groups)

    def _likely_completes(self, job_id: int, items: list[_Item]) -> bool:
        """Whether the batch's acks, with those this committer recorded for the checkpoint before, cover every
        subtask of the job as last seen (a guess: a wrong one costs a heavier lock statement, or the round trip it
        would have saved)."""
        subtasks = self._subtasks.get(job_id)
        if subtasks is None:
            return False
        before = self._recorded.get((job_id, items[0].checkpoint_id), 0)
        return before + len({(it.ack.vertex, it.ack.subtask_index) for it in items}) >= subtasks

    async def _graph(self, s: AsyncSession, job_id: int, attempt: int | None) -> dict[str, int]:
        """vertex -> parallelism. A job's graph changes only when an attempt rescales it, so it is cached per attempt."""
        graph = self._graphs.get((job_id, attempt))
        if graph is None:  # the vertices' key groups are cached with it
            job = await s.get(JobRow, job_id)
            graph = {v["id"]: v["parallelism"] for v in job.graph["vertices"]}
            if len(self._graphs) > 10_000:
                self._graphs.clear()
                self._key_groups.clear()
            self._graphs[(job_id, attempt)] = graph
            self._key_groups[(job_id, attempt)] = {
                v["id"]: v.get("max_parallelism") or MAX_PARALLELISM for v in job.graph["vertices"]
            }
        return graph

    async def _apply_checkpoint(
        self,
        s: AsyncSession,
        job_id: int,
        graph: dict[str, int],
        cp_id: int,
        items: list[_Item],
        facts_read: tuple | None = None,
        preloaded: tuple | None = None,
        key_groups: dict[str, int] | None = None,
    ) -> None:
        """`facts_read`: the checkpoint's facts read with the job and checkpoint row locks; `preloaded`: the rows
        completing needs, read with the locks (`_LOCK_COMPLETING`), when the batch was expected to complete the
        checkpoint."""
        conn = await s.connection()
        cp = facts_read
        if cp is None:
            cp = (await conn.execute(_CHECKPOINT_FACTS, {"b_job": job_id, "b_cp": cp_id})).one_or_none()
        if cp is None:
            try:
                await get_checkpoint_or_404(s, job_id, cp_id)
            except NotFound as exc:
                for it in items:
                    it.result = exc
            return
        # `acked_before`, like the status: read with the locks, so as the transaction that held them before left them
        status, attempt, failure_reason, num_subtasks, acked_before, is_savepoint = cp
        facts = _Facts(job_id, cp_id, attempt, status, failure_reason)
        blob_ids = {
            ref.blob_id
            for it in items
            for ref in (it.ack.operator_state, it.ack.channel_state)
            if ref is not None
        }
        blobs: dict[str, BlobRow] = {}
        if blob_ids and status == PENDING:  # blobs of a finished checkpoint may be released; only new acks need them
            blobs = {
                b.id: b for b in (await s.execute(select(BlobRow).where(BlobRow.id.in_(blob_ids)))).scalars()
            }
        referenced: written.Referenced = {}
        if status == PENDING:
            referenced = await written.referenced_blobs(s, job_id, [it.ack for it in items])
        now = now_ms()
        candidates: dict[tuple[str, int], tuple[_Item, dict]] = {}
        repeats: list[_Item] = []  # a second ack for a subtask within this batch
        for it in items:
            a = it.ack
            key = (a.vertex, a.subtask_index)
            try:
                check_parallelism(job_id, graph, a.vertex, a.subtask_index)
                if key_groups is not None:
                    _check_key_groups(a, key_groups[a.vertex])
                if key in candidates:
                    repeats.append(it)
                    continue
                # Before the insert the prior is not known: a pending checkpoint applies it (the insert finds out).
                if status == PENDING:
                    lifecycle.accept(facts, _request(a))
                    if it.missing is not None:
                        raise it.missing
                    self._check_blobs(job_id, cp_id, a, blobs)
                    written.check_references(job_id, cp_id, a, referenced, is_savepoint)
                else:
                    belongs_to_attempt(a.attempt, attempt, f"checkpoint {cp_id}", "this ack")
            except DomainError as exc:
                it.result = exc
                continue
            row = _row(job_id, cp_id, a, it.digest, now)
            if referenced:
                row["segments"] = written.segments_with_blob_ids(row["segments"], referenced)
            candidates[key] = (it, row)
        inserted: set[tuple[str, int]] = set()
        references_added = False
        if candidates and status == PENDING:
            result = await conn.execute(self._insert_acks, [row for _, row in candidates.values()])
            inserted = {(r[0], r[1]) for r in result}
            references_added = await self._record_written(
                conn, job_id, cp_id, [c for k, c in candidates.items() if k in inserted], now  # in the batch's order
            )
            if inserted:
                if len(self._recorded) > 10_000:
                    self._recorded.clear()
                key = (job_id, cp_id)
                self._recorded[key] = self._recorded.get(key, 0) + len(inserted)
        # Whatever was not inserted was acked before (or the checkpoint is over): the lifecycle decides.
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
            recorded = existing.get(key) or (candidates[key][1]["content_hash"] if key in inserted else None)
            prior = None if recorded is None else ("same" if recorded == it.digest else "different")
            try:
                if lifecycle.accept(facts, _request(it.ack, prior)) == Verdict.unchanged:
                    duplicates.add(id(it))
                else:  # pragma: no cover - a pending checkpoint without the ack would have taken the insert
                    it.result = Conflict(f"checkpoint {cp_id} could not record the ack of {key[0]}[{key[1]}]; retry")
            except DomainError as exc:
                it.result = exc
        num_acked = None
        if inserted:
            rows = [candidates[k][1] for k in inserted]
            longest = max(r["alignment_duration"] for r in rows)
            params = {
                "b_job": job_id,
                "b_cp": cp_id,
                "b_acked": len(rows),
                "b_state": sum(r["state_size"] for r in rows),
                "b_persisted": sum(r["persisted_data"] for r in rows),
                "b_processed": sum(r["processed_data"] for r in rows),
                "b_longest": longest,
                "b_unaligned": any(r["unaligned"] for r in rows),
                "b_now": now,
            }
            completing = None
            if acked_before + len(rows) == num_subtasks:
                # The batch completes the checkpoint: the rows to complete and the facts completing reads, in one
                # round trip (read now: the count read with the lock may predate a commit the lock waited for), the
                # batch's sums added to the loaded row, whose one UPDATE at the flush records them with the
                # completion. Under the job row lock nothing else changes the row meanwhile. Rows read with both
                # locks (`preloaded`) are current already; whether the job has references counts this batch's.
                if preloaded is not None:
                    job_row, cp_row, older_pending, any_ref = preloaded
                    completing = (job_row, cp_row, older_pending, any_ref or references_added)
                else:
                    completing = (await s.execute(_COMPLETING, {"b_job": job_id, "b_cp": cp_id})).one()
                _add_acks(completing[1], params)
                num_acked = completing[1].num_acked
            else:
                num_acked = (await conn.execute(_ADD_ACKS, params)).scalar_one()
                if num_acked == num_subtasks:  # a guard: the count read with the locks counts every committed ack
                    completing = (await s.execute(_COMPLETING, {"b_job": job_id, "b_cp": cp_id})).one()
            if completing is not None and num_acked == num_subtasks:
                job, cp_row, older_pending, referenced = completing
                await complete_checkpoint(s, job, cp_row, now, older_pending=older_pending, referenced=referenced)
                status = COMPLETED
        if num_acked is None:
            num_acked = (await conn.execute(_NUM_ACKED, {"b_job": job_id, "b_cp": cp_id})).scalar_one()
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

    async def _record_written(self, conn, job_id: int, cp_id: int, recorded: list[tuple[_Item, dict]], now: int) -> bool:
        """The blob rows of the objects the recorded acks wrote, in the acks' transaction; True when channel state
        references were recorded."""
        rows_of = {
            id(it): written.blob_rows(job_id, cp_id, it.ack, row["operator_blob_id"], row["channel_blob_id"], now)
            for it, row in recorded
            if it.ack.written is not None
        }
        rows = [b for blob_rows in rows_of.values() for b in blob_rows]
        refs = [r for it, _ in recorded for r in written.reference_rows(job_id, cp_id, it.ack)]
        if refs:
            await conn.execute(insert(ChannelStateRefRow.__table__), refs)
        if not rows:
            return bool(refs)
        named: dict[str, tuple[str, int]] = {}  # acks of this batch naming one object name the same blob ids
        for it, _ in recorded:
            for b in rows_of.get(id(it), ()):
                owner = named.setdefault(b["id"], (it.ack.vertex, it.ack.subtask_index))
                if owner != (it.ack.vertex, it.ack.subtask_index):
                    raise written.object_taken(it.ack, cp_id, owner)
        stored = {r[0] for r in await conn.execute(self._insert_blobs, rows)}
        for it, row in recorded:
            ids = {row["operator_blob_id"], row["channel_blob_id"]} - {None}
            if it.ack.written is not None and not ids <= stored:
                a = it.ack
                owner = (
                    await conn.execute(select(_BLOBS.c.vertex, _BLOBS.c.subtask_index).where(_BLOBS.c.id.in_(ids)))
                ).first()
                if owner is not None and (owner[0], owner[1]) != (a.vertex, a.subtask_index):
                    raise written.object_taken(a, cp_id, (owner[0], owner[1]))
                raise Conflict(
                    f"subtask {a.vertex}[{a.subtask_index}] uploaded state for checkpoint {cp_id} through the "
                    "coordinator before; an ack names its state either as uploaded blobs or as a written object, "
                    "so ack the uploaded blobs"
                )
        return bool(refs)

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


def _check_key_groups(a: SubtaskAck, max_parallelism: int) -> None:
    """422 unless the key groups an ack says its state holds are among its vertex's (`max_parallelism` of them): a
    restore plan hands them to the subtasks that restore it."""
    if a.key_group_end is not None and a.key_group_end >= max_parallelism:
        raise Invalid(
            f"subtask {a.vertex}[{a.subtask_index}] acks key groups {a.key_group_start}..{a.key_group_end}, but vertex "
            f"{a.vertex!r} has {max_parallelism} key groups (0..{max_parallelism - 1}); nothing was recorded"
        )


def _add_acks(cp: CheckpointRow, p: dict) -> None:
    """`_ADD_ACKS` on a loaded checkpoint row (the batch that completes it): the same sums."""
    cp.num_acked += p["b_acked"]
    cp.state_size += p["b_state"]
    cp.persisted_data += p["b_persisted"]
    cp.processed_data += p["b_processed"]
    if cp.alignment_duration is None or p["b_longest"] >= cp.alignment_duration:
        cp.alignment_duration = p["b_longest"]
    cp.any_unaligned = bool(cp.any_unaligned) or p["b_unaligned"]
    cp.latest_ack_ts = p["b_now"]


@dataclass(frozen=True)
class _Facts:
    """The columns of a checkpoint the lifecycle's rules read (the ack path selects only these)."""

    job_id: int
    id: int
    attempt: int
    status: str
    failure_reason: str | None


def _request(a: SubtaskAck, prior: Prior = None) -> SubtaskRequest:
    return SubtaskRequest("ack", a.attempt, f"{a.vertex}[{a.subtask_index}]", prior)


def _row(job_id: int, cp_id: int, a: SubtaskAck, digest: str, now: int) -> dict:
    m = a.metrics
    if a.written is not None:
        operator_blob_id, channel_blob_id = written.blob_ids(a.written)
        state_size = a.written.size
    else:
        operator_blob_id = a.operator_state.blob_id if a.operator_state else None
        channel_blob_id = a.channel_state.blob_id if a.channel_state else None
        state_size = (a.operator_state.size if a.operator_state else 0) + (a.channel_state.size if a.channel_state else 0)
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
        "state_size": state_size,
        "unaligned": m.unaligned,
        "operator_blob_id": operator_blob_id,
        "channel_blob_id": channel_blob_id,
        "segments": [seg.model_dump(mode="json") for seg in a.channel_segments],
        "source_offsets": a.source_offsets,
        "key_group_start": a.key_group_start,
        "key_group_end": a.key_group_end,
    }
