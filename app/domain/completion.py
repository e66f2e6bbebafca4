"""Completing a checkpoint (protocol step 5): PENDING -> COMPLETED in the transaction of its last ack, the older
pending checkpoints it subsumes, and retention of the job's completed checkpoints (step 6); on PostgreSQL the
completion and retention in one statement."""

from __future__ import annotations

from sqlalchemy import BigInteger, Integer, bindparam, exists, insert, select, update
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key

from app.db.models import BlobRow, CheckpointRow, EventRow, JobRow
from app.domain import cleanup, lifecycle
from app.domain.checkpoints import checkpoint_type
from app.domain.context import after_commit, now_ms
from app.domain.lifecycle import COMPLETED, PENDING, AbortReason, abort_checkpoint
from app.events import emit, numbered
from app.observability import CHECKPOINT_DURATION, CHECKPOINTS
from contract.events import CheckpointCompleted
from contract.models import JobStatus

_JOBS, _EVENTS, _CPS = JobRow.__table__, EventRow.__table__, CheckpointRow.__table__

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


_CP_COLUMN_OF = {a.key: a.columns[0].name for a in sa_inspect(CheckpointRow).column_attrs}
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
    kept = _CPS.alias("kept")

    def candidates(t):
        done = t.c.status == COMPLETED
        if completing:
            done = done | (t.c.id == _R_COMPLETING)
        return (t.c.job_id == _R_JOB, done, t.c.is_savepoint.is_(False), t.c.discarded.is_(False))

    # The oldest checkpoint kept: the `retained`-th newest candidate, found once (an uncorrelated scalar subquery).
    # A candidate older than it is discarded. Not `id IN (the candidates ordered newest first, OFFSET retained)`:
    # a plan may run that subquery again for every row of the job (a nested loop, as PostgreSQL chose with a young
    # table's statistics), and each completion then cost the square of the job's checkpoints kept in history
    # (17 ms at 280 of them, growing until the history's trim).
    oldest_kept = (
        select(kept.c.id)
        .where(*candidates(kept))
        .order_by(kept.c.id.desc())
        .offset(bindparam("r_oldest_kept", type_=Integer))
        .limit(1)
        .scalar_subquery()
    )
    discard = (
        update(_CPS)
        .where(
            *candidates(_CPS),
            _CPS.c.id != bindparam("r_latest", type_=BigInteger),
            _CPS.c.id < oldest_kept,
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
        "r_oldest_kept": max(1, int(job.config.get("retained", 1))) - 1,  # newest first, from 0
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
            await cleanup.release(s, job.id, drop, now, marked=True, unreferenced=unreferenced)
