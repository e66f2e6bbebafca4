"""Triggering, completing, aborting, subsuming and collecting checkpoints (protocol steps 1, 5 and 6)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from sqlalchemy import BigInteger, Integer, bindparam, exists, func, insert, select, update
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased, make_transient_to_detached
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key

from app.db.models import BlobRow, CheckpointRow, EventRow, JobRow
from app.domain import cleanup, lifecycle
from app.domain.adaptive import Observations, Seen
from app.domain.context import after_commit, get_job_or_404, now_ms
from app.domain.lifecycle import (
    ACTIVE,
    COMPLETED,
    PENDING,
    AbortReason,
    SubtaskRequest,
    Verdict,
    abort_checkpoint,
    abort_pending,
    release_blobs,
)
from app.domain.policies import POLICY_RULES, barrier_plan, inflight_budget
from app.errors import Conflict, NotFound
from app.events import emit, numbered
from app.observability import CHECKPOINT_DURATION, CHECKPOINTS
from contract.events import CheckpointCompleted, CheckpointTriggered
from contract.models import BarrierPolicy, CheckpointConfig, CheckpointStatus, Decline, JobStatus, WriteTarget

__all__ = ["ACTIVE", "abort_checkpoint", "abort_pending", "release_blobs"]

WriteTargets = Callable[[int, int, int], Awaitable[WriteTarget | None]]
"""(job id, checkpoint id, timeout_at) -> where its subtasks write its state themselves, or None (`Context.write_target`)."""
Backpressure = Callable[[int, int], float | None]
"""(job id, attempt) -> the highest recent backpressure of its subtasks, or None (`Context.backpressure`)."""

HISTORY = 5
"""Finished checkpoints an observing policy is shown (newest first)."""


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
                persisted_data=cp.persisted_data,
                num_subtasks=cp.num_subtasks,
            )
        )
        if len(history) == HISTORY:
            break
    bp = backpressure(job.id, job.current_attempt) if backpressure is not None else None
    return Observations(history=tuple(history), backpressure=bp)


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


_JOBS, _EVENTS = JobRow.__table__, EventRow.__table__
_CP_COLUMNS = [
    (a.key, a.columns[0].name, d.arg if d is not None and d.is_scalar else None)
    for a in sa_inspect(CheckpointRow).column_attrs
    for d in (a.columns[0].default,)
]
"""(attribute, column, scalar default) of every column of a checkpoint row (a trigger sets every column with a
computed default itself)."""


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
    stmt = (
        update(_JOBS)
        .where(_JOBS.c.id == job.id)
        .values(next_checkpoint_id=job.next_checkpoint_id + 1, event_seq=event_row["seq"], last_trigger_at=now,
                updated_at=now)
        .add_cte(insert(_CPS).values(values).cte("new_checkpoint"))
        .add_cte(insert(_EVENTS).values(event_row).cte("new_event"))
    )
    await s.execute(stmt)
    for key, value in (("next_checkpoint_id", job.next_checkpoint_id + 1), ("event_seq", event_row["seq"]),
                       ("last_trigger_at", now), ("updated_at", now)):
        set_committed_value(job, key, value)
    make_transient_to_detached(cp)
    s.add(cp)


async def complete_checkpoint(
    s: AsyncSession,
    job: JobRow,
    cp: CheckpointRow,
    now: int,
    *,
    older_pending: bool | None = None,
    referenced: bool | None = None,
) -> None:
    """PENDING -> COMPLETED in the transaction of the last ack; then subsume older pending ones and collect.

    What the caller read in this transaction under the job row lock (None: not read, so it is looked up):
    `older_pending`, whether an older checkpoint of the job that is not a savepoint is pending (`OLDER_PENDING`);
    `referenced`, whether the job has a channel state reference (`cleanup.any_reference`, read after the
    transaction's last insert of one). False lets the checkpoints this releases skip looking up references."""
    lifecycle.complete(cp, job, now)
    job.updated_at = now
    completed = CheckpointCompleted(
        checkpoint_id=cp.id,
        attempt=cp.attempt,
        is_savepoint=cp.is_savepoint,
        checkpoint_type=checkpoint_type(cp),
        end_to_end_duration=now - cp.trigger_ts,
        persisted_data=cp.persisted_data,
        state_size=cp.state_size,
    )
    duration = (now - cp.trigger_ts) / 1000
    after_commit(s, lambda: (CHECKPOINTS.labels("completed").inc(), CHECKPOINT_DURATION.observe(duration)))
    if older_pending is False and _completion_folds(s, job, cp):
        await _complete_with_retention(s, job, cp, completed, now, unreferenced=referenced is False)
        return
    emit(s, job, completed, now)
    if not cp.is_savepoint:
        if older_pending is not False:
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
                await abort_checkpoint(
                    s,
                    job,
                    old,
                    AbortReason.subsumed,
                    f"checkpoint {cp.id} completed",
                    now,
                    unreferenced=referenced is False,
                )
        await apply_retention(s, job, unreferenced=referenced is False)
    if cp.stop_job:
        await lifecycle.end_job(
            s,
            job,
            JobStatus.finished,
            f"stopped with savepoint {cp.id}",
            AbortReason.job_ended,
            f"job stopped with savepoint {cp.id}",
            now,
        )


def _completion_folds(s: AsyncSession, job: JobRow, cp: CheckpointRow) -> bool:
    """Whether completing `cp` can be written with retention in one statement (`_complete_with_retention`): on
    PostgreSQL, a checkpoint that is not a savepoint and is the job's newest completed one, when nothing but its row
    and the job's is waiting to be flushed (the statement reads the other rows as they are in the database)."""
    ss = s.sync_session
    return (
        not cp.is_savepoint
        and not cp.stop_job
        and job.latest_completed_id == cp.id
        and ss.get_bind().dialect.name == "postgresql"
        and not ss.new
        and not ss.deleted
        and all(o is cp or o is job for o in ss.dirty)
    )


def _changes(obj: object) -> dict[str, object]:
    """attribute -> new value of every column attribute of `obj` changed since it was loaded."""
    state = sa_inspect(obj)
    return {key: hist.added[0] for key in state.mapper.column_attrs.keys() for hist in (state.attrs[key].history,)
            if hist.added}


_CP_COLUMN_OF = {key: name for key, name, _ in _CP_COLUMNS}
_JOB_COLUMN_OF = {a.key: a.columns[0].name for a in sa_inspect(JobRow).column_attrs}
_COMPLETING_STATEMENTS: dict[tuple, object] = {}


def _completing_statement(unreferenced: bool, cp_keys: tuple[str, ...], job_keys: tuple[str, ...],
                          event_keys: tuple[str, ...]):
    """`_complete_with_retention`'s statement for the columns it writes, built once per set of them (a few: what
    completing changes) with every value a bound parameter (`c_cp_<attribute>`, `c_job_<attribute>`,
    `c_event_<column>`; the ids are retention's `r_job` and `r_completing`): building the statement and its cache key
    anew cost more of the completing transaction than PostgreSQL's time for it."""
    shape = (unreferenced, cp_keys, job_keys, event_keys)
    statement = _COMPLETING_STATEMENTS.get(shape)
    if statement is not None:
        return statement

    def bind(table, prefix: str, key: str, column: str):
        return bindparam(f"{prefix}{key}", type_=table.c[column].type)

    statement = (_COMPLETING_DISCARD_AND_RELEASE if unreferenced else _COMPLETING_DISCARD).add_cte(
        update(_CPS)
        .where(_CPS.c.job_id == _R_JOB, _CPS.c.id == _R_COMPLETING)
        .values({_CP_COLUMN_OF[k]: bind(_CPS, "c_cp_", k, _CP_COLUMN_OF[k]) for k in cp_keys})
        .cte("completed")
    ).add_cte(
        insert(_EVENTS).values({k: bind(_EVENTS, "c_event_", k, k) for k in event_keys}).cte("completed_event")
    ).add_cte(
        update(_JOBS)
        .where(_JOBS.c.id == _R_JOB)
        .values({_JOB_COLUMN_OF[k]: bind(_JOBS, "c_job_", k, _JOB_COLUMN_OF[k]) for k in job_keys})
        .cte("completed_job")
    )
    if len(_COMPLETING_STATEMENTS) < 256:
        _COMPLETING_STATEMENTS[shape] = statement
    return statement


async def _complete_with_retention(
    s: AsyncSession, job: JobRow, cp: CheckpointRow, completed: CheckpointCompleted, now: int, *, unreferenced: bool
) -> None:
    """The completed checkpoint's row, its `checkpoint.completed` event, the job's row and retention in one
    statement on PostgreSQL: the checkpoint's and the job's changes and the event's insert are data-modifying WITH
    clauses of retention's statement, which counts the checkpoint as completed (`r_completing`: it reads the rows as
    they were before the statement). The ORM's flush would take a round trip for each, all in the transaction that
    completes the checkpoint. The session then holds the rows as written, as after a flush."""
    event, event_row = numbered(s, job, completed, now)
    job.event_seq = event.id
    cp_changes, job_changes = _changes(cp), _changes(job)
    statement = _completing_statement(unreferenced, tuple(cp_changes), tuple(job_changes), tuple(event_row))
    params = {**_retention_params(job, now_ms()), "r_completing": cp.id}
    params.update({f"c_cp_{k}": v for k, v in cp_changes.items()})
    params.update({f"c_job_{k}": v for k, v in job_changes.items()})
    params.update({f"c_event_{k}": v for k, v in event_row.items()})
    conn = await s.connection()  # not the session's execute: its autoflush would write the rows on their own
    drop = sorted((await conn.execute(statement, params)).scalars(), reverse=True)
    for obj, changes in ((cp, cp_changes), (job, job_changes)):
        for key, value in changes.items():
            set_committed_value(obj, key, value)
    await _retained(s, job, drop, params["r_now"], released=unreferenced, unreferenced=unreferenced)


_CPS = CheckpointRow.__table__
_OLDER = aliased(CheckpointRow)
OLDER_PENDING = (
    exists()
    .where(
        _OLDER.job_id == CheckpointRow.job_id,
        _OLDER.status == PENDING,
        _OLDER.id < CheckpointRow.id,
        _OLDER.is_savepoint.is_(False),
    )
    .correlate(CheckpointRow)
)
"""SQL, in a select of a checkpoint: whether an older checkpoint of its job that is not a savepoint is pending
(those its completion subsumes)."""

_R_JOB = bindparam("r_job", type_=_CPS.c.job_id.type)
_R_COMPLETING = bindparam("r_completing", type_=BigInteger)
_BLOBS = BlobRow.__table__


def _retention_statements(completing: bool) -> tuple:
    """Retention in one statement: discard (and mark for cleaning) the completed checkpoints beyond the newest
    `retained`, never the latest; and on PostgreSQL retention with the release of the discarded checkpoints' blobs
    in one statement (a data-modifying CTE), for a job without channel state references (nothing of the discarded
    checkpoints is held then). `completing`: the statement also completes the checkpoint `r_completing` (in CTEs of
    its own, `_complete_with_retention`), whose row it reads as it was before the statement, pending: it counts
    that checkpoint as completed."""
    done = _CPS.c.status == COMPLETED
    if completing:
        done = done | (_CPS.c.id == _R_COMPLETING)
    newest_first_beyond_retained = (
        select(_CPS.c.id)
        .where(_CPS.c.job_id == _R_JOB, done, _CPS.c.is_savepoint.is_(False), _CPS.c.discarded.is_(False))
        .order_by(_CPS.c.id.desc())
        .offset(bindparam("r_retained", type_=Integer))
    )
    discard = (
        update(_CPS)
        .where(
            _CPS.c.job_id == _R_JOB,
            _CPS.c.id != bindparam("r_latest", type_=BigInteger),
            _CPS.c.id.in_(newest_first_beyond_retained),
        )
        .values(discarded=True, cleanup=cleanup.PREFIX, cleanup_at=bindparam("r_now", type_=BigInteger))
        .returning(_CPS.c.id)
    )
    discarded = discard.cte("discarded")
    release = select(discarded.c.id).add_cte(
        update(_BLOBS)
        .where(
            _BLOBS.c.job_id == _R_JOB,
            _BLOBS.c.checkpoint_id.in_(select(discarded.c.id)),
            _BLOBS.c.status == "stored",
        )
        .values(status="deleting")
        .cte("released")
    )
    return discard, release


_DISCARD_BEYOND_RETAINED, _DISCARD_AND_RELEASE_BEYOND_RETAINED = _retention_statements(completing=False)
_COMPLETING_DISCARD, _COMPLETING_DISCARD_AND_RELEASE = _retention_statements(completing=True)


def _retention_params(job: JobRow, now: int) -> dict:
    return {
        "r_job": job.id,
        "r_retained": max(1, int(job.config.get("retained", 1))),
        "r_latest": -1 if job.latest_completed_id is None else job.latest_completed_id,
        "r_now": now,
    }


async def apply_retention(s: AsyncSession, job: JobRow, *, unreferenced: bool = False) -> list[int]:
    """Keep the newest `retained` completed checkpoints; discard older ones' blobs. Never savepoints, never the latest.
    `unreferenced`: the job has no channel state reference (`cleanup.release`)."""
    now = now_ms()
    await s.flush()  # the statement reads the checkpoints as this transaction changed them (the one just completed)
    conn = await s.connection()
    released = unreferenced and conn.dialect.name == "postgresql"
    statement = _DISCARD_AND_RELEASE_BEYOND_RETAINED if released else _DISCARD_BEYOND_RETAINED
    drop = sorted((await conn.execute(statement, _retention_params(job, now))).scalars(), reverse=True)
    await _retained(s, job, drop, now, released=released, unreferenced=unreferenced)
    return drop


async def _retained(s: AsyncSession, job: JobRow, drop: list[int], now: int, *, released: bool,
                    unreferenced: bool) -> None:
    """After retention's statement discarded `drop` (newest first): what the session and the cleaning learn."""
    if drop:
        identities = s.sync_session.identity_map
        for cp_id in drop:  # the statement bypassed the session: a checkpoint loaded in it learns what changed
            loaded = identities.get(identity_key(CheckpointRow, (job.id, cp_id)))
            if loaded is not None:
                set_committed_value(loaded, "discarded", True)
                set_committed_value(loaded, "cleanup", cleanup.PREFIX)
                set_committed_value(loaded, "cleanup_at", now)
        if released:
            cleanup.blobs_marked(s, job.id, drop)
            cleanup.clean_after_commit(s, job.id, drop)
        else:
            await release_blobs(s, job.id, drop, now, marked=True, unreferenced=unreferenced)


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


def checkpoint_type(cp: CheckpointRow) -> str:
    if cp.is_savepoint:
        return "savepoint"
    return "unaligned" if cp.any_unaligned else "aligned"


def checkpoint_status(cp: CheckpointRow) -> CheckpointStatus:
    return CheckpointStatus(cp.status)
