"""Triggering checkpoints (protocol step 1), declining them, and looking up a checkpoint or a subtask of its job;
completing, subsuming and collecting them are `app.domain.completion`'s, aborting is `app.domain.lifecycle`'s."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from sqlalchemy import JSON, BigInteger, bindparam, func, insert, select, update
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import make_transient_to_detached
from sqlalchemy.orm.attributes import set_committed_value

from app.db.models import CheckpointRow, EventRow, JobRow
from app.domain import lifecycle
from app.domain.adaptive import HISTORY, Observations, Seen
from app.domain.context import after_commit, get_job_or_404
from app.domain.lifecycle import (
    ACTIVE,
    COMPLETED,
    PENDING,
    AbortReason,
    SubtaskRequest,
    Verdict,
    abort_checkpoint,
    abort_pending,
)
from app.domain.policies import POLICY_RULES, barrier_plan, inflight_budget
from app.errors import Conflict, NotFound
from app.events import emit, numbered
from app.observability import CHECKPOINTS
from contract.events import CheckpointTriggered
from contract.models import BarrierPolicy, CheckpointConfig, CheckpointStatus, Decline, JobStatus, WriteTarget

__all__ = ["ACTIVE", "abort_checkpoint", "abort_pending"]

WriteTargets = Callable[[int, int, int], Awaitable[WriteTarget | None]]
"""(job id, checkpoint id, timeout_at) -> where its subtasks write its state themselves, or None (`Context.write_target`)."""
Backpressure = Callable[[int, int], float | None]
"""(job id, attempt) -> the highest recent backpressure of its subtasks, or None (`Context.backpressure`)."""



def _policy(value: str) -> BarrierPolicy | None:
    try:
        return BarrierPolicy(value)
    except ValueError:
        return None


async def observations(s: AsyncSession, job: JobRow, backpressure: Backpressure | None) -> Observations:
    """What an observing policy (adaptive) decides from: the job's newest finished checkpoints (completed, or failed
    by expiry or decline; interrupted ones say nothing about alignment) and the live backpressure."""
    rows = (
        await s.execute(
            select(CheckpointRow)
            .where(
                CheckpointRow.job_id == job.id,
                CheckpointRow.status != PENDING,
                CheckpointRow.is_savepoint.is_(False),
                CheckpointRow.details.is_(None),
            )
            .order_by(CheckpointRow.id.desc())
            .limit(HISTORY * 4)
        )
    ).scalars()
    history: list[Seen] = []
    for cp in rows:
        failed = None
        if cp.status != COMPLETED:
            code = (cp.failure_reason or "").split(":", 1)[0].strip()
            if code not in (AbortReason.expired.value, AbortReason.declined.value):
                continue
            failed = code
        history.append(
            Seen(
                id=cp.id,
                failed=failed,
                unaligned=cp.any_unaligned,
                switched=cp.switched_ts is not None
                or (cp.any_unaligned and cp.policy != BarrierPolicy.unaligned.value and bool(cp.alignment_timeout)),
                alignment_duration=cp.alignment_duration,
                start_delay=cp.start_delay,
                persisted_data=cp.persisted_data,
                num_subtasks=cp.num_subtasks,
                policy=_policy(cp.policy),
                duration=cp.completed_ts - cp.trigger_ts if failed is None and cp.completed_ts else None,
            )
        )
        if len(history) == HISTORY:
            break
    bp = backpressure(job.id, job.current_attempt) if backpressure is not None else None
    return Observations(history=tuple(history), backpressure=bp)


PENDING_IDS = (
    select(CheckpointRow.id)
    .where(
        CheckpointRow.job_id == bindparam("job_id", type_=BigInteger),
        CheckpointRow.discarded.is_(False),
        CheckpointRow.status == PENDING,
    )
    .order_by(CheckpointRow.id)
)
"""A job's pending checkpoints, oldest first. `discarded IS false` holds for every pending checkpoint (retention
discards completed ones only): it lets the database read the index of the job's checkpoints not discarded, a
handful, in id order, and not the job's history (which it scanned whole on a table without statistics: 1 ms at
1,300 checkpoints, at every trigger)."""


async def pending_ids(s: AsyncSession, job_id: int) -> list[int]:
    return list((await s.execute(PENDING_IDS, {"job_id": job_id})).scalars())


def trigger_refusal(job: JobRow, pending: list[int], now: int, savepoint: bool) -> str | None:
    """Why checkpoint triggering is refused right now, or None. Savepoints bypass max_concurrent and min_pause."""
    if job.status not in ACTIVE or job.current_attempt is None:
        if job.status == JobStatus.created.value:
            return (
                f"job {job.id} has no running attempt; start one (POST /api/v1/jobs/{job.id}/attempts) first"
            )
        return f"job {job.id} is {job.status}; checkpoints are taken only while it runs"
    if job.periodic_from is not None and job.running_at is None and now < job.periodic_from:
        # the attempt waits for its subtasks: until all reported running (a restored one: replayed its in-flight
        # data) no checkpoint can be taken consistently
        return (
            f"attempt {job.current_attempt} of job {job.id} is still starting: not every subtask reported running "
            f"yet (a restored subtask does once it replayed its in-flight data); retry in a moment"
        )
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
    targets: WriteTargets | None = None,
    backpressure: Backpressure | None = None,
    pending: list[int] | None = None,
) -> CheckpointRow:
    """Issue the job's next checkpoint id; its trigger event carries its write target (from `targets`). The caller
    holds the job row lock. An observing policy (adaptive) decides from the job's recent checkpoints and
    `backpressure`. `pending`: the job's pending checkpoints (`pending_ids`), if the caller read them under the
    lock already."""
    if pending is None:
        pending = await pending_ids(s, job.id)
    refusal = trigger_refusal(job, pending, now, savepoint)
    if refusal:
        raise Conflict(refusal)
    cfg = CheckpointConfig.model_validate(job.config)
    # Savepoints are always aligned; otherwise the requested policy, or the job's.
    chosen = BarrierPolicy.aligned if savepoint else (policy or cfg.policy)
    seen = await observations(s, job, backpressure) if POLICY_RULES[chosen].observes else None
    plan = barrier_plan(chosen, cfg, seen)
    alignment_timeout = plan.alignment_timeout
    cp = CheckpointRow(
        job_id=job.id,
        id=job.next_checkpoint_id,
        attempt=job.current_attempt,
        status=PENDING,
        is_savepoint=savepoint,
        stop_job=stop,
        policy=plan.policy.value,
        alignment_timeout=alignment_timeout,
        trigger_ts=now,
        timeout_at=now + cfg.timeout,
        switch_at=(now + plan.switch_after) if plan.switch_after is not None else None,
        num_subtasks=job.num_subtasks,
        num_acked=0,
        state_size=0,
        persisted_data=0,
        processed_data=0,
        any_unaligned=False,
        num_unaligned=0,
        num_over_budget=0,
        discarded=False,
        decision=plan.decision.model_dump(mode="json") if plan.decision else None,
    )
    target = await targets(job.id, cp.id, cp.timeout_at) if targets is not None else None
    if target is not None and not savepoint and cfg.incremental_channel_state:
        target = target.model_copy(update={"incremental": True})
    triggered = CheckpointTriggered(
        checkpoint_id=cp.id,
        attempt=cp.attempt,
        policy=cp.policy,
        alignment_timeout=alignment_timeout,
        trigger_timestamp=now,
        inflight_budget=inflight_budget(plan.policy, cfg, job.num_subtasks),
        over_inflight_budget=cfg.over_inflight_budget,
        max_concurrent=cfg.max_concurrent,
        timeout_at=cp.timeout_at,
        is_savepoint=savepoint,
        stop=stop,
        target=target,
    )
    conn = await s.connection()
    if conn.dialect.name == "postgresql":
        await _record_trigger(s, job, cp, triggered, now)
    else:
        job.next_checkpoint_id += 1
        job.last_trigger_at = now
        job.updated_at = now
        s.add(cp)
        emit(s, job, triggered, now)
    after_commit(s, lambda: CHECKPOINTS.labels("triggered").inc())
    return cp


_JOBS, _EVENTS, _CPS = JobRow.__table__, EventRow.__table__, CheckpointRow.__table__
_CP_COLUMNS = [
    (a.key, a.columns[0].name, d.arg if d is not None and d.is_scalar else None)
    for a in sa_inspect(CheckpointRow).column_attrs
    for d in (a.columns[0].default,)
]
"""(attribute, column, scalar default) of every column of a checkpoint row (a trigger sets every column with a
computed default itself)."""


_TRIGGER_STATEMENTS: dict[tuple[tuple[str, ...], tuple[str, ...]], object] = {}
"""`_trigger_statement`'s statements by the checkpoint columns and event keys they insert (one shape in practice)."""


def _trigger_statement(cp_columns: tuple[str, ...], event_keys: tuple[str, ...]):
    """`_record_trigger`'s statement for the columns it inserts, built once per set of them with every value a bound
    parameter (`t_cp_<column>`, `t_event_<column>`, and the job's `t_job`, `t_next`, `t_seq`, `t_last`,
    `t_updated`): building it and its cache key anew for every trigger cost about as much as PostgreSQL's time for
    it, between the trigger's timestamp and the subtasks' barriers."""
    shape = (cp_columns, event_keys)
    statement = _TRIGGER_STATEMENTS.get(shape)
    if statement is not None:
        return statement

    def bind(table, name: str, column: str):
        kind = table.c[column].type
        # a None bound to a JSON column would be stored as JSON null; as a value of `.values()` it was SQL NULL
        return bindparam(name, type_=JSON(none_as_null=True) if isinstance(kind, JSON) else kind)

    statement = (
        update(_JOBS)
        .where(_JOBS.c.id == bind(_JOBS, "t_job", "id"))
        .values(next_checkpoint_id=bind(_JOBS, "t_next", "next_checkpoint_id"),
                event_seq=bind(_JOBS, "t_seq", "event_seq"), last_trigger_at=bind(_JOBS, "t_last", "last_trigger_at"),
                updated_at=bind(_JOBS, "t_updated", "updated_at"))
        .add_cte(insert(_CPS).values({c: bind(_CPS, f"t_cp_{c}", c) for c in cp_columns}).cte("new_checkpoint"))
        .add_cte(insert(_EVENTS).values({k: bind(_EVENTS, f"t_event_{k}", k) for k in event_keys}).cte("new_event"))
    )
    if len(_TRIGGER_STATEMENTS) < 64:
        _TRIGGER_STATEMENTS[shape] = statement
    return statement


async def _record_trigger(s: AsyncSession, job: JobRow, cp: CheckpointRow, triggered: CheckpointTriggered, now: int) -> None:
    """The new checkpoint's row, its trigger event and the job's counters in one statement (PostgreSQL runs the
    inserts as data-modifying WITH clauses of the job's update); the session then holds them as written. The ORM
    flush would take a round trip for each, and every round trip lies between the trigger timestamp and the
    subtasks' barriers."""
    _, event_row = numbered(s, job, triggered, now)
    # the columns set, as the flush would insert them (one left out takes its default: NULL, not a JSON null)
    values = {name: cp.__dict__[key] for key, name, _ in _CP_COLUMNS if key in cp.__dict__}
    for key, _, default in _CP_COLUMNS:
        if key not in cp.__dict__:
            set_committed_value(cp, key, default)  # as the flush would leave it: loaded, nothing to read back
    params = {"t_job": job.id, "t_next": job.next_checkpoint_id + 1, "t_seq": event_row["seq"], "t_last": now,
              "t_updated": now}
    params.update({f"t_cp_{c}": v for c, v in values.items()})
    params.update({f"t_event_{k}": v for k, v in event_row.items()})
    await s.execute(_trigger_statement(tuple(values), tuple(event_row)), params)
    for key, value in (("next_checkpoint_id", job.next_checkpoint_id + 1), ("event_seq", event_row["seq"]),
                       ("last_trigger_at", now), ("updated_at", now)):
        set_committed_value(job, key, value)
    make_transient_to_detached(cp)
    s.add(cp)


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
    request = SubtaskRequest("decline", body.attempt, f"{body.vertex}[{body.subtask_index}]")
    if lifecycle.accept(cp, request) == Verdict.unchanged:
        return cp  # declining an aborted checkpoint changes nothing (a retried decline lands here)
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


UNALIGNED_POLICIES = (BarrierPolicy.unaligned.value, BarrierPolicy.unaligned_last_barrier.value)


def checkpoint_type(cp: CheckpointRow) -> str:
    """What the coordinator decided for the checkpoint, whatever its subtasks did (`subtask_modes`): the policy its
    barriers carried (for the adaptive policy, the one it chose); aligned_then_unaligned is aligned until the
    coordinator switched it at its alignment timeout. A savepoint is always aligned."""
    if cp.is_savepoint:
        return "savepoint"
    if cp.policy in UNALIGNED_POLICIES:
        return "unaligned"
    if cp.policy == BarrierPolicy.aligned_then_unaligned.value and cp.switched_ts is not None:
        return "unaligned"
    return "aligned"


def checkpoint_status(cp: CheckpointRow) -> CheckpointStatus:
    return CheckpointStatus(cp.status)
