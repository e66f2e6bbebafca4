"""Triggering, completing, aborting, subsuming and collecting checkpoints (protocol steps 1, 5 and 6)."""

from __future__ import annotations

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import BlobRow, CheckpointRow, JobRow
from app.domain import lifecycle
from app.domain.context import after_commit, delete_after_commit, get_job_or_404
from app.domain.lifecycle import ABORTED, COMPLETED, PENDING, AbortReason
from app.errors import Conflict, NotFound
from app.events import emit
from app.observability import CHECKPOINT_DURATION, CHECKPOINTS
from client.models import BarrierPolicy, CheckpointConfig, CheckpointStatus, Decline, EventType, JobStatus

ACTIVE = (JobStatus.running.value, JobStatus.failing.value)


async def pending_ids(s: AsyncSession, job_id: int) -> list[int]:
    rows = await s.execute(
        select(CheckpointRow.id)
        .where(CheckpointRow.job_id == job_id, CheckpointRow.status == PENDING)
        .order_by(CheckpointRow.id)
    )
    return list(rows.scalars())


def trigger_refusal(job: JobRow, pending: list[int], now: int, savepoint: bool) -> str | None:
    """Why checkpoint triggering is refused right now, or None. Savepoints bypass max_concurrent and min_pause."""
    if job.status not in ACTIVE or job.current_attempt is None:
        if job.status == JobStatus.created.value:
            return (
                f"job {job.id} has no running attempt; start one (POST /api/v1/jobs/{job.id}/attempts) first"
            )
        return f"job {job.id} is {job.status}; checkpoints are taken only while it runs"
    if savepoint:
        return None
    cfg = CheckpointConfig.model_validate(job.config)
    if len(pending) >= cfg.max_concurrent:
        return (
            f"job {job.id} has {len(pending)} pending checkpoint(s) {pending} and max_concurrent={cfg.max_concurrent}; "
            "wait until one completes or aborts"
        )
    if cfg.min_pause and job.last_completed_at is not None and now - job.last_completed_at < cfg.min_pause:
        waited = now - job.last_completed_at
        return (
            f"min_pause={cfg.min_pause} ms has not passed since checkpoint {job.latest_completed_id} completed "
            f"{waited} ms ago; retry in {cfg.min_pause - waited} ms"
        )
    return None


async def trigger(
    s: AsyncSession,
    job: JobRow,
    now: int,
    *,
    policy: BarrierPolicy | None = None,
    savepoint: bool = False,
    stop: bool = False,
) -> CheckpointRow:
    """Issue the job's next checkpoint id. The caller holds the job row lock."""
    pending = await pending_ids(s, job.id)
    refusal = trigger_refusal(job, pending, now, savepoint)
    if refusal:
        raise Conflict(refusal)
    cfg = CheckpointConfig.model_validate(job.config)
    effective = BarrierPolicy.aligned if savepoint else (policy or cfg.policy)
    alignment_timeout = None
    if effective == BarrierPolicy.aligned_then_unaligned:
        alignment_timeout = cfg.alignment_timeout if cfg.alignment_timeout is not None else 0
    cp = CheckpointRow(
        job_id=job.id,
        id=job.next_checkpoint_id,
        attempt=job.current_attempt,
        status=PENDING,
        is_savepoint=savepoint,
        stop_job=stop,
        policy=effective.value,
        alignment_timeout=alignment_timeout,
        trigger_ts=now,
        timeout_at=now + cfg.timeout,
        # With a zero timeout the barrier itself says 'unaligned from the start'; no switch event is needed.
        switch_at=(now + alignment_timeout) if alignment_timeout else None,
        num_subtasks=job.num_subtasks,
        num_acked=0,
        state_size=0,
        persisted_data=0,
        processed_data=0,
        any_unaligned=False,
        discarded=False,
    )
    job.next_checkpoint_id += 1
    job.last_trigger_at = now
    job.updated_at = now
    s.add(cp)
    emit(
        s,
        job,
        EventType.checkpoint_triggered,
        {
            "checkpoint_id": cp.id,
            "attempt": cp.attempt,
            "policy": cp.policy,
            "alignment_timeout": alignment_timeout,
            "trigger_timestamp": now,
            "timeout_at": cp.timeout_at,
            "is_savepoint": savepoint,
            "stop": stop,
        },
        now,
    )
    after_commit(s, lambda: CHECKPOINTS.labels("triggered").inc())
    return cp


async def release_blobs(s: AsyncSession, job_id: int, checkpoint_ids: list[int]) -> None:
    """Mark a checkpoint's blobs as no longer referenced; their bytes are deleted after the commit."""
    if not checkpoint_ids:
        return
    ids = list(
        (
            await s.execute(
                select(BlobRow.id).where(
                    BlobRow.job_id == job_id,
                    BlobRow.checkpoint_id.in_(checkpoint_ids),
                    BlobRow.status == "stored",
                )
            )
        ).scalars()
    )
    if ids:
        await s.execute(update(BlobRow).where(BlobRow.id.in_(ids)).values(status="deleting"))
        delete_after_commit(s, job_id, ids)


async def abort_checkpoint(
    s: AsyncSession, job: JobRow, cp: CheckpointRow, reason: AbortReason, detail: str, now: int
) -> None:
    """PENDING -> ABORTED with its reason; its blobs are released. The caller holds the job row lock."""
    became_failing = lifecycle.abort(cp, job, reason, detail, now)
    job.updated_at = now
    await release_blobs(s, job.id, [cp.id])
    emit(
        s,
        job,
        EventType.checkpoint_aborted,
        {
            "checkpoint_id": cp.id,
            "attempt": cp.attempt,
            "reason": cp.failure_reason,
            "is_savepoint": cp.is_savepoint,
        },
        now,
    )
    if became_failing:
        emit(s, job, EventType.job_status, {"status": job.status, "message": job.status_message}, now)
    after_commit(s, lambda: CHECKPOINTS.labels("aborted").inc())


async def abort_pending(
    s: AsyncSession, job: JobRow, reason: AbortReason, detail: str, now: int
) -> list[int]:
    rows = (
        await s.execute(
            select(CheckpointRow)
            .where(CheckpointRow.job_id == job.id, CheckpointRow.status == PENDING)
            .order_by(CheckpointRow.id)
        )
    ).scalars()
    aborted = []
    for cp in list(rows):
        if cp.status != PENDING:
            continue
        await abort_checkpoint(s, job, cp, reason, detail, now)
        aborted.append(cp.id)
    return aborted


async def complete_checkpoint(s: AsyncSession, job: JobRow, cp: CheckpointRow, now: int) -> None:
    """PENDING -> COMPLETED in the transaction of the last ack; then subsume older pending ones and collect."""
    lifecycle.complete(cp, job, now)
    job.updated_at = now
    emit(
        s,
        job,
        EventType.checkpoint_completed,
        {
            "checkpoint_id": cp.id,
            "attempt": cp.attempt,
            "is_savepoint": cp.is_savepoint,
            "checkpoint_type": checkpoint_type(cp),
            "end_to_end_duration": now - cp.trigger_ts,
            "persisted_data": cp.persisted_data,
            "state_size": cp.state_size,
        },
        now,
    )
    duration = (now - cp.trigger_ts) / 1000
    after_commit(s, lambda: (CHECKPOINTS.labels("completed").inc(), CHECKPOINT_DURATION.observe(duration)))
    if not cp.is_savepoint:
        older = (
            await s.execute(
                select(CheckpointRow).where(
                    CheckpointRow.job_id == job.id,
                    CheckpointRow.status == PENDING,
                    CheckpointRow.id < cp.id,
                    CheckpointRow.is_savepoint.is_(False),
                )
            )
        ).scalars()
        for old in list(older):
            await abort_checkpoint(s, job, old, AbortReason.subsumed, f"checkpoint {cp.id} completed", now)
        await apply_retention(s, job)
    if cp.stop_job:
        await abort_pending(s, job, AbortReason.job_ended, f"job stopped with savepoint {cp.id}", now)
        lifecycle.move_job(job, JobStatus.finished, f"stopped with savepoint {cp.id}")
        emit(s, job, EventType.job_status, {"status": job.status, "message": job.status_message}, now)


async def apply_retention(s: AsyncSession, job: JobRow) -> list[int]:
    """Keep the newest `retained` completed checkpoints; discard older ones' blobs. Never savepoints, never the latest."""
    retained = max(1, int(job.config.get("retained", 1)))
    ids = list(
        (
            await s.execute(
                select(CheckpointRow.id)
                .where(
                    CheckpointRow.job_id == job.id,
                    CheckpointRow.status == COMPLETED,
                    CheckpointRow.is_savepoint.is_(False),
                    CheckpointRow.discarded.is_(False),
                )
                .order_by(CheckpointRow.id.desc())
            )
        ).scalars()
    )
    drop = [i for i in ids[retained:] if i != job.latest_completed_id]
    if drop:
        await s.execute(
            update(CheckpointRow)
            .where(CheckpointRow.job_id == job.id, CheckpointRow.id.in_(drop))
            .values(discarded=True)
        )
        await release_blobs(s, job.id, drop)
    return drop


async def get_checkpoint_or_404(s: AsyncSession, job_id: int, checkpoint_id: int) -> CheckpointRow:
    cp = await s.get(CheckpointRow, (job_id, checkpoint_id))
    if cp is None:
        latest = (
            await s.execute(select(func.max(CheckpointRow.id)).where(CheckpointRow.job_id == job_id))
        ).scalar()
        hint = f"its latest checkpoint is {latest}" if latest else "it has no checkpoints yet"
        raise NotFound(f"job {job_id} has no checkpoint {checkpoint_id}; {hint}")
    return cp


async def decline(s: AsyncSession, job_id: int, checkpoint_id: int, body: Decline, now: int) -> CheckpointRow:
    job = await get_job_or_404(s, job_id, lock=True)
    cp = await get_checkpoint_or_404(s, job_id, checkpoint_id)
    check_subtask(job, body.vertex, body.subtask_index)
    if body.attempt != cp.attempt:
        raise Conflict(
            f"checkpoint {cp.id} belongs to attempt {cp.attempt}; this decline is from attempt {body.attempt}"
        )
    if cp.status == ABORTED:
        return cp  # declining an aborted checkpoint changes nothing (a retried decline lands here)
    if cp.status == COMPLETED:
        raise Conflict(f"checkpoint {cp.id} is already COMPLETED; it cannot be declined")
    await abort_checkpoint(
        s, job, cp, AbortReason.declined, f"subtask {body.vertex}[{body.subtask_index}]: {body.reason}", now
    )
    return cp


def check_subtask(job: JobRow, vertex: str, index: int) -> None:
    check_parallelism(job.id, {v["id"]: v["parallelism"] for v in job.graph["vertices"]}, vertex, index)


def check_parallelism(job_id: int, parallelism: dict[str, int], vertex: str, index: int) -> None:
    """404 unless `vertex[index]` is a subtask of the job (`parallelism`: vertex id -> parallelism)."""
    p = parallelism.get(vertex)
    if p is None:
        raise NotFound(f"job {job_id} has no vertex {vertex!r}; its vertices are {', '.join(parallelism)}")
    if index >= p:
        raise NotFound(
            f"job {job_id} has no subtask {vertex}[{index}]: vertex {vertex!r} has parallelism {p}"
        )


def checkpoint_type(cp: CheckpointRow) -> str:
    if cp.is_savepoint:
        return "savepoint"
    return "unaligned" if cp.any_unaligned else "aligned"


def checkpoint_status(cp: CheckpointRow) -> CheckpointStatus:
    return CheckpointStatus(cp.status)
