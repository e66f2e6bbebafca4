"""Acks with group commit: concurrent acks are recorded in one transaction (protocol step 4/5).

Every ack of a checkpoint updates the same checkpoint row, so a transaction per ack serializes on
that row and on the commit's fsync. The committer instead drains whatever acks are waiting, records
them all in one transaction under the job row lock, and answers each only after that commit: an
ack is acknowledged only once it is durable. While one batch commits, the next one gathers.

Under the locks, each checkpoint's acks of the batch go through named steps (`AckCommitter._commit_checkpoint`):
admit (`ack_admission`), insert (`ack_recording`), settle the acks not inserted (`ack_admission`), classify, count
and complete (`ack_counting`), answer. The values they pass each other are typed (`ack_batch`); the SQL is
`ack_store`'s.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import defaultdict

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import JobRow
from app.db.session import TransientDatabaseError
from app.domain import ack_store
from app.domain.ack_admission import admit, admit_tokens, settle
from app.domain.ack_batch import AckItem, CheckpointBatch, Counted, Inserted
from app.domain.ack_counting import classify, count_and_complete
from app.domain.ack_recording import ack_hash, insert
from app.domain.ack_store import CheckpointFacts, Completing, LockedJob
from app.domain.checkpoints import get_checkpoint_or_404
from app.domain.context import BackgroundWorker, Context, after_commit
from app.errors import DomainError, NotFound
from app.observability import ACK_BATCH, ACK_COMMIT_SECONDS, ACKS
from contract.models import MAX_PARALLELISM, AckResult, CheckpointStatus, SubtaskAck

__all__ = ["AckCommitter", "AckItem", "ack_hash"]

log = logging.getLogger(__name__)
LINGER = 0.003  # seconds an ack batch waits at most for acks that are arriving


class AckCommitter(BackgroundWorker):
    name = "overtake-ack-committer"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.max_batch = ctx.settings.ack_batch_max
        self._queue: asyncio.Queue[AckItem] = asyncio.Queue()
        self._graphs: dict[tuple[int, int | None], dict[str, int]] = {}
        self._key_groups: dict[tuple[int, int | None], dict[str, int]] = {}  # vertex -> max_parallelism
        self._subtasks: dict[int, int] = {}  # job -> its subtasks, as last seen (a hint: a rescale changes it)
        self._recorded: dict[tuple[int, int], int] = {}  # (job, checkpoint) -> acks this committer recorded for it

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
        items = [AckItem(job_id, checkpoint_id, a, ack_hash(a), token_attempt, loop.create_future()) for a in acks]
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

    async def _commit(self, batch: list[AckItem]) -> None:
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

    async def _apply_retrying(self, batch: list[AckItem]) -> None:
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

    async def _apply(self, s: AsyncSession, batch: list[AckItem]) -> None:
        by_job: dict[int, list[AckItem]] = defaultdict(list)
        for it in batch:
            by_job[it.job_id].append(it)
        # Job rows are locked in one global order (by id), so two replicas' batches never wait for each other in
        # a cycle; then, per job, its checkpoints.
        for job_id, items in sorted(by_job.items()):
            locked, facts, preloaded = await self._lock(s, job_id, items)
            if locked is None:
                for it in items:
                    it.result = NotFound(f"job {job_id} does not exist")
                continue
            items = admit_tokens(job_id, locked, items)
            graph = await self._graph(s, job_id, locked.current_attempt)
            key_groups = self._key_groups[(job_id, locked.current_attempt)]
            by_cp: dict[int, list[AckItem]] = defaultdict(list)
            for it in items:
                by_cp[it.checkpoint_id].append(it)
            self._subtasks[job_id] = sum(graph.values())
            for cp_id, cp_items in by_cp.items():
                cp_facts = await self._checkpoint_facts(s, job_id, cp_id, cp_items, facts)
                if cp_facts is not None:
                    cp = CheckpointBatch(job_id, cp_id, cp_items, cp_facts, graph, key_groups, preloaded)
                    await self._commit_checkpoint(s, cp)

    async def _lock(
        self, s: AsyncSession, job_id: int, items: list[AckItem]
    ) -> tuple[LockedJob | None, CheckpointFacts | None, Completing | None]:
        """The job row's lock (one lock order everywhere: job, then its checkpoints), and for a batch of one
        checkpoint that exists its row's lock and facts in the same round trip. Only the attempt is read of the job
        (the graph comes from a cache: graphs never change), unless the batch will likely complete the checkpoint:
        then the full rows completing needs come with the locks (one round trip less for the batch that completes).
        None for the job: it does not exist."""
        conn = await s.connection()
        cp_ids = {it.checkpoint_id for it in items}
        if len(cp_ids) == 1:
            (cp_id,) = cp_ids
            if self._likely_completes(job_id, items):
                preloaded = await ack_store.lock_completing(s, job_id, cp_id)
                if preloaded is not None:
                    job = preloaded.job
                    return LockedJob(job.current_attempt, job.status), CheckpointFacts.of(preloaded.checkpoint), preloaded
            # the usual case: the locks and the checkpoint's state in one round trip
            both = await ack_store.lock_job_with_checkpoint(conn, job_id, cp_id)
            if both is not None:
                return both[0], both[1], None
        # several checkpoints, or one that does not exist: the job row's lock alone; each checkpoint's facts are
        # read after it
        return await ack_store.lock_job(conn, job_id), None, None

    async def _checkpoint_facts(
        self, s: AsyncSession, job_id: int, cp_id: int, items: list[AckItem], facts: CheckpointFacts | None
    ) -> CheckpointFacts | None:
        """The checkpoint's facts: read with the locks (`facts`, as the transaction that held them before left them)
        or now, after the job row's lock. None: no such checkpoint, and its acks are answered 404."""
        if facts is None:
            facts = await ack_store.checkpoint_facts(await s.connection(), job_id, cp_id)
        if facts is None:
            try:
                await get_checkpoint_or_404(s, job_id, cp_id)
            except NotFound as exc:
                for it in items:
                    it.result = exc
        return facts

    async def _commit_checkpoint(self, s: AsyncSession, cp: CheckpointBatch) -> None:
        """One checkpoint's acks of the batch, step by step. A step that refuses an ack sets its answer (the error);
        the following steps pass over it."""
        admitted = await admit(s, cp)  # attempt, subtask, checkpoint state, stored blobs and written objects
        inserted = await insert(await s.connection(), cp, admitted)  # the ack rows, then their blob rows
        self._count_recorded(cp, inserted)
        duplicates = await settle(s, cp, admitted, inserted)  # not inserted: a retried ack, or a conflicting one (409)
        outcome = classify(cp.facts, inserted)  # nothing new, counted (still pending), or completes
        counted = await count_and_complete(s, cp, outcome, inserted, admitted.now)
        _answer(s, cp, inserted, duplicates, counted)

    def _count_recorded(self, cp: CheckpointBatch, inserted: Inserted) -> None:
        """Remember how many acks of the checkpoint this committer recorded (`_likely_completes`)."""
        if inserted.rows:
            if len(self._recorded) > 10_000:
                self._recorded.clear()
            key = (cp.job_id, cp.cp_id)
            self._recorded[key] = self._recorded.get(key, 0) + len(inserted.rows)

    def _likely_completes(self, job_id: int, items: list[AckItem]) -> bool:
        """Whether the batch's acks, with those this committer recorded for the checkpoint before, cover every
        subtask of the job as last seen (a guess: a wrong one costs a heavier lock statement, or the round trip it
        would have saved)."""
        subtasks = self._subtasks.get(job_id)
        if subtasks is None:
            return False
        before = self._recorded.get((job_id, items[0].checkpoint_id), 0)
        return before + len({it.subtask for it in items}) >= subtasks

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


def _answer(s: AsyncSession, cp: CheckpointBatch, inserted: Inserted, duplicates: set[int], counted: Counted) -> None:
    """Every ack of the checkpoint not refused is answered with the checkpoint as the batch left it; the counts of
    recorded, repeated and refused acks go to the metrics once the transaction commits."""
    recorded, dup = len(inserted.rows), len(duplicates)
    refused = sum(1 for it in cp.items if isinstance(it.result, DomainError))
    after_commit(
        s,
        lambda: (
            ACKS.labels("recorded").inc(recorded),
            ACKS.labels("duplicate").inc(dup),
            ACKS.labels("refused").inc(refused),
        ),
    )
    status = CheckpointStatus(counted.status)
    for it in cp.items:
        if it.result is None:
            it.result = AckResult.model_construct(
                checkpoint_id=cp.cp_id,
                vertex=it.ack.vertex,
                subtask_index=it.ack.subtask_index,
                status=status,
                num_acknowledged_subtasks=counted.num_acked,
                num_subtasks=cp.facts.num_subtasks,
                duplicate=id(it) in duplicates,
            )
