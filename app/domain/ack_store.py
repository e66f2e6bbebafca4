"""The ack path's SQL: its statements, built once (building SQL expressions costs more than running them) and run
on the session's connection as Core statements with bound parameters, behind named calls that return typed rows.

The committer (``app.domain.acks``) decides; this module reads and writes. Every read that takes a row lock takes
the job row's first, then the checkpoint's (one lock order everywhere).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import BigInteger, Boolean, Integer, bindparam, case, insert, select, tuple_, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from app.db.models import AckRow, BlobRow, ChannelStateRefRow, CheckpointRow, JobRow
from app.domain import cleanup
from app.domain.completion import OLDER_PENDING


class LockedJob(NamedTuple):
    """The job row's columns read under its lock: who may ack (the current attempt) and whether it still runs."""

    current_attempt: int | None
    status: str


class CheckpointFacts(NamedTuple):
    """The checkpoint's columns the acceptance rules and the counting read, under the checkpoint row's lock."""

    status: str
    attempt: int
    failure_reason: str | None
    num_subtasks: int
    num_acked: int
    is_savepoint: bool
    trigger_ts: int

    @classmethod
    def of(cls, cp: CheckpointRow) -> CheckpointFacts:
        """The same facts from a loaded checkpoint row."""
        return cls(*(getattr(cp, name) for name in cls._fields))


class Completing(NamedTuple):
    """The rows completing a checkpoint needs, loaded in the session: the job's and the checkpoint's, whether an
    older checkpoint of the job is pending (to subsume) and whether the job has channel-state references (to keep)."""

    job: JobRow
    checkpoint: CheckpointRow
    older_pending: bool
    referenced: bool


_JOBS, _CHECKPOINTS = JobRow.__table__, CheckpointRow.__table__
ACKS_TABLE, BLOBS_TABLE = AckRow.__table__, BlobRow.__table__
_JOB, _CP = bindparam("b_job"), bindparam("b_cp")
_LOCK_JOB = select(_JOBS.c.current_attempt, _JOBS.c.status).where(_JOBS.c.id == _JOB).with_for_update()
_THIS_CP = (_CHECKPOINTS.c.job_id == _JOB) & (_CHECKPOINTS.c.id == _CP)
_FACT_COLUMNS = [_CHECKPOINTS.c[name] for name in CheckpointFacts._fields]  # the one list of the facts' columns
_CHECKPOINT_FACTS = select(*_FACT_COLUMNS).where(_THIS_CP)
# The job row's lock with the checkpoint's facts, in one round trip. The checkpoint's row is locked too (after the
# job's: one lock order): a row read without its lock is read as of the statement's start, so after a wait for the
# job row's lock it would still show a checkpoint pending that the transaction holding the lock aborted (a
# replica's scheduler expiring it, a newer checkpoint subsuming it, a new attempt), and an ack would be recorded
# into an aborted checkpoint. A locked row is read as that transaction left it. No row: the checkpoint (or the
# job) does not exist, and `_LOCK_JOB` takes the lock alone.
_LOCK_JOB_WITH_CP = (
    select(_JOBS.c.current_attempt, _JOBS.c.status, *_FACT_COLUMNS)
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
# A batch's rows: an ack or a blob row already there (a retried ack, or a conflicting one) is not inserted again,
# and the rows inserted say which they were.
_INSERTS = {
    dialect: (
        insert_of(ACKS_TABLE).on_conflict_do_nothing().returning(ACKS_TABLE.c.vertex, ACKS_TABLE.c.subtask_index),
        insert_of(BLOBS_TABLE).on_conflict_do_nothing().returning(BLOBS_TABLE.c.id),
    )
    for dialect, insert_of in (("sqlite", sqlite_insert), ("postgresql", pg_insert))
}
_INSERT_REFERENCES = insert(ChannelStateRefRow.__table__)
_LONGEST = bindparam("b_longest", type_=BigInteger)
_LATEST_START = bindparam("b_start_delay", type_=BigInteger)
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
        start_delay=case(
            (_CHECKPOINTS.c.start_delay > _LATEST_START, _CHECKPOINTS.c.start_delay), else_=_LATEST_START
        ),
        any_unaligned=_CHECKPOINTS.c.any_unaligned | bindparam("b_unaligned", type_=Boolean),
        num_unaligned=_CHECKPOINTS.c.num_unaligned + bindparam("b_num_unaligned", type_=Integer),
        num_over_budget=_CHECKPOINTS.c.num_over_budget + bindparam("b_over_budget", type_=Integer),
        latest_ack_ts=bindparam("b_now", type_=BigInteger),
    )
    .returning(_CHECKPOINTS.c.num_acked)
)


def _key(job_id: int, cp_id: int) -> dict[str, int]:
    return {"b_job": job_id, "b_cp": cp_id}


async def lock_job(conn: AsyncConnection, job_id: int) -> LockedJob | None:
    """The job row's lock alone (None: no such job)."""
    row = (await conn.execute(_LOCK_JOB, {"b_job": job_id})).one_or_none()
    return None if row is None else LockedJob(*row)


async def lock_job_with_checkpoint(
    conn: AsyncConnection, job_id: int, cp_id: int
) -> tuple[LockedJob, CheckpointFacts] | None:
    """The job's and the checkpoint's row locks and the checkpoint's facts, in one round trip (None: no such
    checkpoint of that job)."""
    row = (await conn.execute(_LOCK_JOB_WITH_CP, _key(job_id, cp_id))).one_or_none()
    return None if row is None else (LockedJob(*row[:2]), CheckpointFacts(*row[2:]))


async def checkpoint_facts(conn: AsyncConnection, job_id: int, cp_id: int) -> CheckpointFacts | None:
    """The checkpoint's facts, read after the job row's lock (None: no such checkpoint)."""
    row = (await conn.execute(_CHECKPOINT_FACTS, _key(job_id, cp_id))).one_or_none()
    return None if row is None else CheckpointFacts(*row)


async def lock_completing(s: AsyncSession, job_id: int, cp_id: int) -> Completing | None:
    """The job and checkpoint rows completing needs, loaded with both row locks, with whether older checkpoints
    are pending and whether the job has channel-state references (None: no such checkpoint)."""
    row = (await s.execute(_LOCK_COMPLETING, _key(job_id, cp_id))).one_or_none()
    return None if row is None else Completing(*row)


async def completing_rows(s: AsyncSession, job_id: int, cp_id: int) -> Completing:
    """The same rows, reloaded under locks already held (the checkpoint's counts changed since)."""
    return Completing(*(await s.execute(_COMPLETING, _key(job_id, cp_id))).one())


async def stored_blobs(s: AsyncSession, blob_ids: set[str]) -> dict[str, BlobRow]:
    """The rows of uploaded blobs that acks name, by id (one missing: not uploaded)."""
    return {b.id: b for b in (await s.execute(select(BlobRow).where(BlobRow.id.in_(blob_ids)))).scalars()}


async def insert_acks(conn: AsyncConnection, rows: list[dict]) -> set[tuple[str, int]]:
    """Insert ack rows; the (vertex, subtask index) of those inserted (the others' subtasks had acked before)."""
    result = await conn.execute(_INSERTS[conn.dialect.name][0], rows)
    return {(r[0], r[1]) for r in result}


async def insert_blobs(conn: AsyncConnection, rows: list[dict]) -> set[str]:
    """Insert blob rows (of written objects' parts); the ids of those inserted (the others were there)."""
    return {r[0] for r in await conn.execute(_INSERTS[conn.dialect.name][1], rows)}


async def insert_references(conn: AsyncConnection, rows: list[dict]) -> None:
    """Insert channel-state reference rows (an incremental checkpoint's segments held by older checkpoints)."""
    await conn.execute(_INSERT_REFERENCES, rows)


async def blob_owner(conn: AsyncConnection, blob_ids: set[str]) -> tuple[str, int] | None:
    """The subtask (vertex, index) of one of these blobs' rows, if one is there."""
    owner = (
        await conn.execute(select(BLOBS_TABLE.c.vertex, BLOBS_TABLE.c.subtask_index).where(BLOBS_TABLE.c.id.in_(blob_ids)))
    ).first()
    return None if owner is None else (owner[0], owner[1])


async def recorded_hashes(
    s: AsyncSession, job_id: int, cp_id: int, subtasks: list[tuple[str, int]]
) -> dict[tuple[str, int], str]:
    """(vertex, subtask index) -> the content hash of the ack recorded for that subtask of the checkpoint."""
    rows = await s.execute(
        select(AckRow.vertex, AckRow.subtask_index, AckRow.content_hash).where(
            AckRow.job_id == job_id,
            AckRow.checkpoint_id == cp_id,
            tuple_(AckRow.vertex, AckRow.subtask_index).in_(subtasks),
        )
    )
    return {(r[0], r[1]): r[2] for r in rows}


async def add_acks(conn: AsyncConnection, params: dict[str, Any]) -> int:
    """Add a batch's sums to the checkpoint row in one statement; the checkpoint's acks now."""
    return (await conn.execute(_ADD_ACKS, params)).scalar_one()


async def num_acked(conn: AsyncConnection, job_id: int, cp_id: int) -> int:
    return (await conn.execute(_NUM_ACKED, _key(job_id, cp_id))).scalar_one()
