"""Cleaning checkpoints' prefixes in the blob store (protocol steps 5 and 6): what a released checkpoint leaves there
is deleted by prefix, what a completed one holds beyond what its acks name is pruned, and a sweep retries both.

A checkpoint's ``cleanup`` says what is left to do under its prefix, ``cleanup_at`` from when:

- ``prefix``: the checkpoint was aborted or discarded under the retention policy (never a savepoint, never the
  latest completed): everything under its prefix goes, with its blob rows. Done at once after the commit that
  released it, and once more after its timeout (plus ``OVERTAKE_LATE_WRITE_GRACE``), when no subtask can still be
  writing for it: an object written after the abort (a subtask that had not heard of it yet) is collected then.
- ``unreferenced``: the checkpoint completed: after its timeout (plus the grace), every object under its prefix
  that no ack names is deleted (a subtask's object written before it crashed, then written again under another
  name; a blob uploaded through the coordinator and never acked).
- ``held``: the checkpoint was released, but the channel state of a checkpoint not released references objects
  under its prefix (incremental channel state, ``channel_state_refs``): nothing is deleted, its blobs stay stored,
  and it is released for good by the release that drops the last such reference.

The sweep (the scheduler's) picks checkpoints whose ``cleanup_at`` has come, oldest first, so a deletion that
failed (the store was away) is retried. Cleaning is idempotent; two replicas may clean the same prefix.
"""

from __future__ import annotations

import logging

from sqlalchemy import bindparam, delete, exists, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value

from app.blobstore import BlobStore, blob_key, checkpoint_prefix, claim
from app.db.models import AckRow, BlobRow, ChannelStateRefRow, CheckpointRow
from app.db.session import Database
from app.errors import DomainError, Unavailable
from app.observability import BLOBS_DELETED

log = logging.getLogger(__name__)

PREFIX = "prefix"
UNREFERENCED = "unreferenced"
HELD = "held"
RETRY_AFTER_MS = 30_000  # a cleaning that failed is tried again this much later

_BLOBS = BlobRow.__table__
_MARK_DELETING = (
    update(_BLOBS)
    .where(
        _BLOBS.c.job_id == bindparam("c_job"),
        _BLOBS.c.checkpoint_id.in_(bindparam("c_ids", expanding=True)),
        _BLOBS.c.status == "stored",
    )
    .values(status="deleting")
)


def clean_after_commit(session: AsyncSession, job_id: int, checkpoint_ids: list[int]) -> None:
    """Clean these checkpoints' prefixes once the session's transaction has committed."""
    session.info.setdefault("overtake_cleanup", []).extend((job_id, cp) for cp in checkpoint_ids)


def pending_cleanups(session: AsyncSession) -> list[tuple[int, int]]:
    return session.info.pop("overtake_cleanup", [])


async def release(
    s: AsyncSession,
    job_id: int,
    checkpoint_ids: list[int],
    now: int,
    *,
    marked: bool = False,
    unreferenced: bool = False,
) -> None:
    """Nothing references these checkpoints' state any more: mark their blobs and their prefixes for deletion,
    which happens after the commit (`clean_after_commit`) and, should it fail, in the sweep.

    `marked`: the statement that released them already set their ``cleanup`` to ``prefix`` and ``cleanup_at`` to
    `now` (a checkpoint held after all is then set to ``held`` here). `unreferenced`: the caller read in this
    transaction, under the job row lock and after its last insert of references, that the job has no channel state
    reference at all (`any_reference`), so none is looked up."""
    if not checkpoint_ids:
        return
    released = checkpoint_ids if unreferenced else await _unless_referenced(s, job_id, checkpoint_ids)
    if not released:
        return
    await s.flush()  # as an ORM statement would: the statement below bypasses the session
    await (await s.connection()).execute(_MARK_DELETING, {"c_job": job_id, "c_ids": released})
    blobs_marked(s, job_id, released)
    if marked:
        given = set(checkpoint_ids)
        unmarked = [cp for cp in released if cp not in given]  # freed by the references their channel state held
    else:
        unmarked = released
    if unmarked:
        await s.execute(
            update(CheckpointRow)
            .where(CheckpointRow.job_id == job_id, CheckpointRow.id.in_(unmarked))
            .values(cleanup=PREFIX, cleanup_at=now)
        )
    clean_after_commit(s, job_id, released)


def blobs_marked(s: AsyncSession, job_id: int, checkpoint_ids: list[int]) -> None:
    """A statement outside the session set these checkpoints' stored blobs to ``deleting`` (`_MARK_DELETING`): a
    blob loaded in the session learns what changed."""
    ids = set(checkpoint_ids)
    for obj in s.sync_session.identity_map.values():
        if isinstance(obj, BlobRow):
            loaded = obj.__dict__  # its loaded attributes only (reading an expired one would load it)
            if loaded.get("job_id") == job_id and loaded.get("checkpoint_id") in ids and loaded.get("status") == "stored":
                set_committed_value(obj, "status", "deleting")


def any_reference(job_id):
    """SQL: whether the job (`job_id`: a column expression of the enclosing select) has a channel state reference."""
    refs = ChannelStateRefRow.__table__
    return exists().where(refs.c.job_id == job_id).correlate_except(refs)


async def _unless_referenced(s: AsyncSession, job_id: int, checkpoint_ids: list[int]) -> list[int]:
    """Of the checkpoints being released, those whose prefix may go: the references their own channel state held
    are dropped (which may free checkpoints held for them alone), and a checkpoint that a checkpoint not released
    still references is held instead."""
    refs = ChannelStateRefRow
    # Both directions in one read: what their channel state references, and who references them.
    pairs = (
        await s.execute(
            select(refs.checkpoint_id, refs.ref_checkpoint_id)
            .where(
                refs.job_id == job_id,
                or_(refs.checkpoint_id.in_(checkpoint_ids), refs.ref_checkpoint_id.in_(checkpoint_ids)),
            )
            .distinct()
        )
    ).all()
    if not pairs:
        return checkpoint_ids
    given = set(checkpoint_ids)
    were_referenced = {ref for cp, ref in pairs if cp in given}
    if were_referenced:
        await s.execute(delete(refs).where(refs.job_id == job_id, refs.checkpoint_id.in_(checkpoint_ids)))
        freed = (
            await s.execute(
                select(CheckpointRow.id).where(
                    CheckpointRow.job_id == job_id,
                    CheckpointRow.id.in_(were_referenced),
                    CheckpointRow.cleanup == HELD,
                )
            )
        ).scalars()
        checkpoint_ids = sorted(given | set(freed))
        held = set(
            (
                await s.execute(
                    select(refs.ref_checkpoint_id)
                    .where(refs.job_id == job_id, refs.ref_checkpoint_id.in_(checkpoint_ids))
                    .distinct()
                )
            ).scalars()
        )
    else:  # nothing was deleted: the pairs read say who references them
        held = {ref for _, ref in pairs if ref in given}
    if held:
        await s.execute(
            update(CheckpointRow)
            .where(CheckpointRow.job_id == job_id, CheckpointRow.id.in_(held))
            .values(cleanup=HELD, cleanup_at=None)
        )
    return [cp for cp in checkpoint_ids if cp not in held]


def prune_when_late_writes_are_over(cp: CheckpointRow) -> None:
    """A completed checkpoint: once no subtask can still write for it, prune what its acks do not name."""
    cp.cleanup = UNREFERENCED
    cp.cleanup_at = cp.timeout_at


class Cleaner:
    """Cleans checkpoints' prefixes: `clean` one (after the commit that released it), `sweep` those due."""

    def __init__(self, db: Database, store: BlobStore, late_write_grace_ms: int, owner: str | None = None) -> None:
        self.db = db
        self.store = store
        self.grace = late_write_grace_ms
        self.owner = owner
        """The deployment that must hold the store (`blobstore.claim`) before anything in it is deleted; None: no
        claim (the embedded default, whose store lies in the deployment's own data directory)."""
        self._claimed = owner is None

    async def ensure_claimed(self) -> None:
        """Claim the store for `owner` once; until then nothing is written into it or deleted from it. Raises
        `StoreTaken` (another deployment holds it), or `Unavailable` when the store does not answer (503: the
        caller changed nothing and may retry)."""
        if self._claimed:
            return
        try:
            await claim(self.store, self.owner)
        except DomainError:
            raise
        except Exception as exc:  # noqa: BLE001 - the store did not answer: nothing was changed, the caller retries
            raise Unavailable(
                f"the blob store {self.store.url} did not answer when asked which deployment holds it ({exc!r}); "
                "nothing was changed, retry"
            ) from exc
        self._claimed = True

    async def clean(self, job_id: int, cp_id: int, now: int) -> None:
        async with self.db.session(readonly=True) as s:
            row = (
                await s.execute(
                    select(CheckpointRow.cleanup, CheckpointRow.timeout_at).where(
                        CheckpointRow.job_id == job_id, CheckpointRow.id == cp_id
                    )
                )
            ).one_or_none()
            if row is None or row[0] is None or row[0] == HELD:
                return
            kind, timeout_at = row
            blobs = (
                await s.execute(
                    select(BlobRow.id, BlobRow.key, BlobRow.status).where(
                        BlobRow.job_id == job_id, BlobRow.checkpoint_id == cp_id
                    )
                )
            ).all()
            referenced: set[str] = set()
            if kind == UNREFERENCED:
                acks = await s.execute(
                    select(AckRow.operator_blob_id, AckRow.channel_blob_id).where(
                        AckRow.job_id == job_id, AckRow.checkpoint_id == cp_id
                    )
                )
                referenced = {b for pair in acks for b in pair if b}
        await self.ensure_claimed()  # never delete from a store another deployment holds
        late_until = timeout_at + self.grace
        prefix = checkpoint_prefix(job_id, cp_id)
        dropped: list[str] = []
        if kind == PREFIX:
            for blob_id, key, _ in blobs:
                if key is None:  # stored before the per-checkpoint layout
                    await self.store.delete(blob_key(job_id, blob_id))
            await self.store.delete_prefix(prefix)
            dropped = [b[0] for b in blobs if b[2] == "deleting"]
        elif now >= late_until:
            keep = {key for blob_id, key, _ in blobs if blob_id in referenced and key}
            for blob_id, key, _ in blobs:
                if blob_id not in referenced and key is None:
                    await self.store.delete(blob_key(job_id, blob_id))
            pruned = await self.store.prune(prefix, keep)
            if pruned:
                log.info("checkpoint %s of job %s: deleted %d object(s) no ack names", cp_id, job_id, len(pruned))
            dropped = [b[0] for b in blobs if b[0] not in referenced]
        done = now >= late_until
        async with self.db.session() as s:
            if dropped:
                await s.execute(delete(BlobRow).where(BlobRow.id.in_(dropped)))
            await s.execute(
                update(CheckpointRow)
                .where(CheckpointRow.job_id == job_id, CheckpointRow.id == cp_id, CheckpointRow.cleanup == kind)
                .values(cleanup=None if done else kind, cleanup_at=None if done else late_until)
            )
        if dropped:
            BLOBS_DELETED.inc(len(dropped))

    async def clean_all(self, checkpoints: list[tuple[int, int]], now: int) -> None:
        """Clean each; a failure is logged and left to the sweep."""
        for job_id, cp_id in dict.fromkeys(checkpoints):
            try:
                await self.clean(job_id, cp_id, now)
            except Exception as exc:  # noqa: BLE001 - the sweep retries
                log.warning("could not clean checkpoint %s of job %s (the sweep retries): %s", cp_id, job_id, exc)
                await self._retry_later(job_id, cp_id, now)

    async def _retry_later(self, job_id: int, cp_id: int, now: int) -> None:
        """Put a failed cleaning behind the others due, so one prefix the store keeps refusing holds up none."""
        try:
            async with self.db.session() as s:
                await s.execute(
                    update(CheckpointRow)
                    .where(
                        CheckpointRow.job_id == job_id,
                        CheckpointRow.id == cp_id,
                        CheckpointRow.cleanup.is_not(None),
                        CheckpointRow.cleanup_at <= now,
                    )
                    .values(cleanup_at=now + RETRY_AFTER_MS)
                )
        except Exception as exc:  # noqa: BLE001 - it stays due and is tried again in the next sweep
            log.warning("could not reschedule the cleaning of checkpoint %s of job %s: %s", cp_id, job_id, exc)

    async def sweep(self, now: int, limit: int = 200) -> int:
        """Clean the checkpoints whose cleaning is due (oldest first); returns how many were tried."""
        async with self.db.session(readonly=True) as s:
            due = (
                await s.execute(
                    select(CheckpointRow.job_id, CheckpointRow.id)
                    .where(CheckpointRow.cleanup_at <= now)
                    .order_by(CheckpointRow.cleanup_at)
                    .limit(limit)
                )
            ).all()
        await self.clean_all([(r[0], r[1]) for r in due], now)
        return len(due)
