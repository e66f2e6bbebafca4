"""Read models: jobs, checkpoints, a checkpoint's details and a job's attempts, built from the stored rows (a
checkpoint's channel state: ``channel_state_views``; a job's statistics: ``statistics``)."""

from __future__ import annotations

import math
from collections import defaultdict

from sqlalchemy import and_, case, exists, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AckRow, AttemptRow, BlobRow, CheckpointRow, EventRow, JobRow
from app.domain.checkpoints import checkpoint_type, get_checkpoint_or_404
from app.domain.context import LiveBackpressure, get_job_or_404
from app.domain.lifecycle import ABORTED, COMPLETED, PENDING, AbortReason
from contract.events import AttemptStarted
from contract.models import (
    TERMINAL_JOB_STATUSES,
    AttemptInfo,
    AttemptPage,
    BlobRef,
    Checkpoint,
    CheckpointConfig,
    CheckpointDetail,
    CheckpointPage,
    CheckpointStatus,
    CheckpointType,
    Graph,
    Job,
    JobPage,
    JobStatus,
    MinMaxAvg,
    RecoveryPhases,
    SubtaskModes,
    SubtaskStats,
    VertexCheckpointSummary,
)

INTERRUPTED = [r.value for r in AbortReason if not r.counts_as_failure]
"""Abort reasons that are not failures of the checkpoint: the job ended, a new attempt, a newer checkpoint."""


def abort_reason(failure_reason: str | None) -> str | None:
    """The reason code an aborted checkpoint's failure_reason starts with ('job_ended: ...'), if it is one."""
    if not failure_reason:
        return None
    code = failure_reason.split(":", 1)[0].strip()
    return code if code in AbortReason._value2member_map_ else None


def _is_interrupted():
    return or_(*(CheckpointRow.failure_reason.like(f"{code}%") for code in INTERRUPTED))


async def _counts(s: AsyncSession, job_ids: list[int]) -> dict[int, dict[str, int]]:
    """Checkpoints per job by status, 'interrupted': the aborted ones that were not failures, and 'savepoints', in one
    pass over the jobs' checkpoints (a long history has hundreds of thousands)."""
    out: dict[int, dict[str, int]] = defaultdict(
        lambda: {PENDING: 0, COMPLETED: 0, ABORTED: 0, "interrupted": 0, "savepoints": 0}
    )
    if not job_ids:
        return out
    interrupted = func.sum(case((and_(CheckpointRow.status == ABORTED, _is_interrupted()), 1), else_=0))
    savepoints = func.sum(case((CheckpointRow.is_savepoint.is_(True), 1), else_=0))
    rows = await s.execute(
        select(CheckpointRow.job_id, CheckpointRow.status, func.count(), interrupted, savepoints)
        .where(CheckpointRow.job_id.in_(job_ids))
        .group_by(CheckpointRow.job_id, CheckpointRow.status)
    )
    for job_id, status, n, not_failed, saved in rows:
        out[job_id][status] = n
        out[job_id]["interrupted"] += int(not_failed or 0)
        out[job_id]["savepoints"] += int(saved or 0)
    return out


def job_model(job: JobRow, counts: dict[str, int]) -> Job:
    return Job(
        id=job.id,
        name=job.name,
        kind=job.kind,
        status=JobStatus(job.status),
        graph=Graph.model_validate(job.graph),
        checkpoint=CheckpointConfig.model_validate(job.config),
        labels=job.labels or {},
        current_attempt=job.current_attempt,
        created_at=job.created_at,
        updated_at=job.updated_at,
        status_message=job.status_message,
        consecutive_failures=job.consecutive_failures,
        latest_completed_checkpoint_id=job.latest_completed_id,
        latest_completed_at=job.last_completed_at,
        num_completed=counts.get(COMPLETED, 0),
        num_failed=counts.get(ABORTED, 0) - counts.get("interrupted", 0),
        num_in_progress=counts.get(PENDING, 0),
        num_not_finished=counts.get("interrupted", 0),
        num_interrupted=counts.get("interrupted", 0),
        scheduler_error=job.scheduler_error,
        running_at=job.running_at,
    )


async def job_view(s: AsyncSession, job: JobRow) -> Job:
    return job_model(job, (await _counts(s, [job.id]))[job.id])


def _has_label(dialect: str, key: str, value: str):
    """Jobs whose label `key` is `value`, in SQL: labels live in a JSON column, read with the dialect's JSON
    functions (PostgreSQL `->>`; SQLite `json_each`, which takes any key, where a JSON path would need escaping)."""
    if dialect == "postgresql":
        return JobRow.labels[key].as_string() == value
    pairs = func.json_each(JobRow.labels).table_valued("key", "value")
    return exists().select_from(pairs).where(pairs.c.key == key, pairs.c.value == value)


async def list_jobs(
    s: AsyncSession, status: JobStatus | None, name: str | None, limit: int, offset: int, label: str | None = None
) -> JobPage:
    conds = []
    if status is not None:
        conds.append(JobRow.status == status.value)
    if name is not None:
        conds.append(JobRow.name == name)
    if label is not None:
        key, _, value = label.partition("=")
        conds.append(_has_label(s.get_bind().dialect.name, key, value))
    total = (await s.execute(select(func.count()).select_from(JobRow).where(*conds))).scalar_one()
    jobs = list(
        (await s.execute(select(JobRow).where(*conds).order_by(JobRow.id.desc()).limit(limit).offset(offset))).scalars()
    )
    counts = await _counts(s, [j.id for j in jobs])
    return JobPage(items=[job_model(j, counts[j.id]) for j in jobs], total=total)


def checkpoint_model(cp: CheckpointRow) -> Checkpoint:
    return Checkpoint(
        id=cp.id,
        job_id=cp.job_id,
        attempt=cp.attempt,
        status=CheckpointStatus(cp.status),
        is_savepoint=cp.is_savepoint,
        checkpoint_type=CheckpointType(checkpoint_type(cp)),
        subtask_modes=SubtaskModes(
            unaligned=cp.num_unaligned or 0,
            aligned=cp.num_acked - (cp.num_unaligned or 0) - (cp.num_over_budget or 0),
            aligned_over_budget=cp.num_over_budget or 0,
        ),
        policy=cp.policy,
        alignment_timeout=cp.alignment_timeout,
        trigger_timestamp=cp.trigger_ts,
        latest_ack_timestamp=cp.latest_ack_ts,
        completed_timestamp=cp.completed_ts if cp.status == COMPLETED else None,
        switched_to_unaligned_timestamp=cp.switched_ts,
        end_to_end_duration=(cp.completed_ts - cp.trigger_ts)
        if cp.status == COMPLETED and cp.completed_ts
        else None,
        state_size=cp.state_size,
        persisted_data=cp.persisted_data,
        processed_data=cp.processed_data,
        alignment_duration=cp.alignment_duration,
        start_delay=cp.start_delay,
        num_subtasks=cp.num_subtasks,
        num_acknowledged_subtasks=cp.num_acked,
        failure_reason=cp.failure_reason,
        failure_timestamp=cp.completed_ts if cp.status == ABORTED else None,
        abort_reason=abort_reason(cp.failure_reason) if cp.status == ABORTED else None,
        discarded=cp.discarded,
        stop_job=cp.stop_job,
        details={k: v for k, v in cp.details.items() if k != "digest"} if cp.details else None,
        decision=cp.decision,
    )


async def list_checkpoints(
    s: AsyncSession, job_id: int, status: CheckpointStatus | None, limit: int, offset: int
) -> CheckpointPage:
    await get_job_or_404(s, job_id)
    q = select(CheckpointRow).where(CheckpointRow.job_id == job_id)
    cq = select(func.count()).select_from(CheckpointRow).where(CheckpointRow.job_id == job_id)
    if status is not None:
        q, cq = q.where(CheckpointRow.status == status.value), cq.where(CheckpointRow.status == status.value)
    total = (await s.execute(cq)).scalar_one()
    rows = (await s.execute(q.order_by(CheckpointRow.id.desc()).limit(limit).offset(offset))).scalars()
    return CheckpointPage(items=[checkpoint_model(r) for r in rows], total=total)


def _blob_ref(blob: BlobRow | None) -> BlobRef | None:
    return BlobRef(blob_id=blob.id, sha256=blob.sha256, size=blob.size) if blob else None


async def checkpoint_detail(s: AsyncSession, job_id: int, checkpoint_id: int) -> CheckpointDetail:
    job = await get_job_or_404(s, job_id)
    cp = await get_checkpoint_or_404(s, job_id, checkpoint_id)
    acks = list(
        (
            await s.execute(
                select(AckRow)
                .where(AckRow.job_id == job_id, AckRow.checkpoint_id == checkpoint_id)
                .order_by(AckRow.vertex, AckRow.subtask_index)
            )
        ).scalars()
    )
    blob_ids = [b for a in acks for b in (a.operator_blob_id, a.channel_blob_id) if b]
    blobs = {}
    if blob_ids:
        blobs = {
            b.id: b for b in (await s.execute(select(BlobRow).where(BlobRow.id.in_(blob_ids)))).scalars()
        }
    acked = {(a.vertex, a.subtask_index) for a in acks}
    pending = [
        f"{v['id']}[{i}]"
        for v in job.graph["vertices"]
        for i in range(v["parallelism"])
        if (v["id"], i) not in acked and cp.status == PENDING and cp.attempt == (job.current_attempt or cp.attempt)
    ]
    never_acked = []
    if cp.status == ABORTED and abort_reason(cp.failure_reason) in ("expired", "declined"):
        never_acked = [
            f"{v['id']}[{i}]" for v in job.graph["vertices"] for i in range(v["parallelism"]) if (v["id"], i) not in acked
        ]
    subtasks = [
        SubtaskStats(
            vertex=a.vertex,
            subtask_index=a.subtask_index,
            ack_timestamp=a.ack_ts,
            end_to_end_duration=a.ack_ts - cp.trigger_ts,
            state_size=a.state_size,
            sync_duration=a.sync_duration,
            async_duration=a.async_duration,
            alignment_duration=a.alignment_duration,
            start_delay=a.start_delay,
            processed_data=a.processed_data,
            persisted_data=a.persisted_data,
            unaligned=a.unaligned,
            aligned_over_budget=bool(a.aligned_over_budget),
            operator_state=_blob_ref(blobs.get(a.operator_blob_id)) if a.operator_blob_id else None,
            channel_state=_blob_ref(blobs.get(a.channel_blob_id)) if a.channel_blob_id else None,
            source_offsets=a.source_offsets,
        )
        for a in acks
    ]
    return CheckpointDetail(
        **checkpoint_model(cp).model_dump(),
        subtasks=subtasks,
        pending_subtasks=pending,
        never_acked_subtasks=never_acked,
        vertices=vertex_summaries(job.graph, subtasks),
    )


_SUMMED = (
    "end_to_end_duration",
    "state_size",
    "sync_duration",
    "async_duration",
    "alignment_duration",
    "start_delay",
    "processed_data",
    "persisted_data",
)


def summarize(values: list[float]) -> MinMaxAvg:
    if not values:
        return MinMaxAvg()
    vs = sorted(values)

    def pct(p: float) -> float:
        # nearest-rank percentile
        return float(vs[max(0, min(len(vs) - 1, math.ceil(p * len(vs)) - 1))])

    return MinMaxAvg(
        min=float(vs[0]), max=float(vs[-1]), avg=sum(vs) / len(vs), p50=pct(0.5), p90=pct(0.9), p99=pct(0.99)
    )


def vertex_summaries(graph: dict, subtasks: list[SubtaskStats]) -> list[VertexCheckpointSummary]:
    """Per vertex (graph order, then any vertex only the acks name): min/avg/max of each figure across subtasks."""
    by_vertex: dict[str, list[SubtaskStats]] = defaultdict(list)
    for st in subtasks:
        by_vertex[st.vertex].append(st)
    parallelism = {v["id"]: v["parallelism"] for v in graph.get("vertices", [])}
    order = list(parallelism) + [v for v in by_vertex if v not in parallelism]
    out = []
    for vertex in order:
        acked = by_vertex.get(vertex, [])
        out.append(
            VertexCheckpointSummary(
                vertex=vertex,
                parallelism=parallelism.get(vertex, len(acked)),
                num_acknowledged_subtasks=len(acked),
                num_unaligned=sum(1 for a in acked if a.unaligned),
                num_aligned_over_budget=sum(1 for a in acked if a.aligned_over_budget),
                latest_ack_timestamp=max((a.ack_timestamp for a in acked), default=None),
                **{field: summarize([getattr(a, field) for a in acked]) for field in _SUMMED},
            )
        )
    return out


_ENDED = {status.value for status in TERMINAL_JOB_STATUSES}


async def list_attempts(
    s: AsyncSession, job_id: int, limit: int, offset: int, live: LiveBackpressure | None = None
) -> AttemptPage:
    """A job's attempts, newest first: what each restored (from the attempts table) and, from its
    `attempt.started` event, the checkpoints its restore passed over and the vertices it rescaled; the current
    attempt's recovery phases from the live metrics `live` holds."""
    job = await get_job_or_404(s, job_id)
    total = (
        await s.execute(select(func.count()).select_from(AttemptRow).where(AttemptRow.job_id == job_id))
    ).scalar_one()
    rows = list(
        (
            await s.execute(
                select(AttemptRow)
                .where(AttemptRow.job_id == job_id)
                .order_by(AttemptRow.number.desc())
                .limit(limit)
                .offset(offset)
            )
        ).scalars()
    )
    started: dict[int, AttemptStarted] = {}
    if rows:
        events = await s.execute(
            select(EventRow.data).where(
                EventRow.job_id == job_id,
                EventRow.type == AttemptStarted.type.value,
                EventRow.ts >= min(r.started_at for r in rows),
            )
        )
        for (data,) in events:
            payload = AttemptStarted.model_validate(data)
            started[payload.attempt] = payload
    restored = {r.restored_checkpoint_id for r in rows if r.restored_checkpoint_id is not None}
    savepoints: set[int] = set()
    if restored:
        savepoints = set(
            (
                await s.execute(
                    select(CheckpointRow.id).where(
                        CheckpointRow.job_id == job_id,
                        CheckpointRow.id.in_(restored),
                        CheckpointRow.is_savepoint.is_(True),
                    )
                )
            ).scalars()
        )
    # why each ended: the reason its successor started with (which may be on the page before this one)
    successors = {r.number + 1 for r in rows}
    next_reason = dict(
        (
            await s.execute(
                select(AttemptRow.number, AttemptRow.reason).where(
                    AttemptRow.job_id == job_id, AttemptRow.number.in_(successors)
                )
            )
        ).all()
    ) if rows else {}
    items = []
    for r in rows:
        event = started.get(r.number)
        if r.number + 1 in next_reason:
            end_reason = next_reason[r.number + 1] or "a new attempt started"
        elif job.status in _ENDED:
            end_reason = f"the job ended as {job.status}" + (f": {job.status_message}" if job.status_message else "")
        else:
            end_reason = None
        items.append(
            AttemptInfo(
                attempt=r.number,
                started_at=r.started_at,
                ended_at=r.ended_at,
                restored_checkpoint_id=r.restored_checkpoint_id,
                restored_is_savepoint=r.restored_checkpoint_id in savepoints,
                reason=r.reason,
                fallbacks=event.fallbacks if event else [],
                rescaled=event.rescaled if event else [],
                recorded=event is not None,
                end_reason=end_reason,
                phases=_phases(live, job, r),
            )
        )
    return AttemptPage(items=items, total=total)


def _phases(live: LiveBackpressure | None, job: JobRow, attempt: AttemptRow) -> RecoveryPhases | None:
    """The current attempt's recovery phases, as far as this replica's live metrics know them."""
    if live is None or attempt.number != job.current_attempt:
        return None
    subtasks = sum(v["parallelism"] for v in job.graph.get("vertices", []))
    return live.phases(job.id, attempt.number, attempt.started_at, subtasks)
