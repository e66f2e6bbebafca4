"""State a subtask wrote straight into the blob store (protocol step 4): what an ack naming such an object must pass
before the ack committer counts it, and the blob rows that record where its two parts lie.

The checks run before the ack is submitted, concurrently for the acks of one request, off the event loop; the
committer stays free of I/O. A key outside the checkpoint's prefix of the ack's own job is refused outright (and
never looked up: the coordinator tells nobody whether another job's object exists). An object that is missing or
has another size refuses the ack only while its checkpoint is pending: a retry of an ack recorded before stays a
duplicate even when the checkpoint's objects were collected since.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.blobstore import checkpoint_prefix
from app.db.models import AckRow, BlobRow, CheckpointRow
from app.domain.context import Context
from app.errors import Conflict, DomainError, Forbidden, Invalid, Unavailable
from contract.models import CheckpointStatus, SegmentPart, SubtaskAck, WrittenState

STAT_TIMEOUT = 30.0  # seconds an ack waits at most for the store to say whether its object is there


class NotWritten(Invalid):
    """The object an ack names is not in the blob store as the ack says."""


@dataclass(frozen=True)
class WrittenCheck:
    refusal: DomainError | None = None
    """The ack can never be recorded (answered at once, never submitted)."""
    missing: DomainError | None = None
    """The object is not there as the ack says: refused unless the same ack was recorded before."""


def key_refusal(ctx: Context, job_id: int, cp_id: int, a: SubtaskAck) -> DomainError | None:
    """Why the ack's written object can never be counted for this job and checkpoint, or None."""
    w = a.written
    assert w is not None
    who = f"subtask {a.vertex}[{a.subtask_index}]"
    refusal = reference_refusal(job_id, cp_id, a)
    if refusal is not None:
        return refusal
    if not ctx.direct_writes:
        return Invalid(
            f"{who} acks an object it wrote into the blob store, but this coordinator takes state only through "
            "uploads (OVERTAKE_STATE_WRITES=coordinator): send it with acks/with-state; nothing was recorded"
        )
    prefix = checkpoint_prefix(job_id, cp_id)
    if w.key.startswith(prefix):
        return None
    if not w.key.startswith(f"job-{job_id}/"):
        return Forbidden(
            f"{who} acks object {w.key!r}, which is not under job {job_id}'s prefix; for checkpoint {cp_id} it "
            f"writes under {prefix}; nothing was recorded"
        )
    return Invalid(
        f"{who} acks object {w.key!r}, which is not under checkpoint {cp_id}'s prefix {prefix}; "
        "nothing was recorded"
    )


async def check(ctx: Context, job_id: int, cp_id: int, acks: list[SubtaskAck]) -> list[WrittenCheck | None]:
    """For each ack (None: it names no written object): whether its object may be counted. The objects are
    stat'ed (HEAD on S3) concurrently, never read."""
    checks: list[WrittenCheck | None] = [None] * len(acks)
    to_stat: list[int] = []
    for i, a in enumerate(acks):
        if a.written is None:
            continue
        refusal = key_refusal(ctx, job_id, cp_id, a)
        if refusal is not None:
            checks[i] = WrittenCheck(refusal=refusal)
        else:
            to_stat.append(i)
    sizes: list = []
    if to_stat:
        keys = [acks[i].written.key for i in to_stat]
        try:
            if getattr(ctx.store, "local", False):
                # stats on the event loop (a local file system): nothing to wait for, so no task to bound it
                # (`wait_for` would run the check as a task of its own, on a later turn of a busy event loop)
                sizes = await ctx.store.sizes(keys)
            else:
                sizes = await asyncio.wait_for(ctx.store.sizes(keys), STAT_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - no answer within the bound, or the store failed: each ack says so
            sizes = [e] * len(to_stat)
    for i, size in zip(to_stat, sizes, strict=True):
        checks[i] = WrittenCheck(missing=_missing(acks[i], size))
    return checks


def _missing(a: SubtaskAck, size: int | None | BaseException) -> DomainError | None:
    w = a.written
    who = f"subtask {a.vertex}[{a.subtask_index}]"
    if isinstance(size, BaseException):
        why = f"no answer within {STAT_TIMEOUT:g} s" if isinstance(size, asyncio.TimeoutError) else repr(size)
        return Unavailable(f"the blob store could not say whether object {w.key} exists ({why}); retry the ack")
    if size is None:
        return NotWritten(
            f"object {w.key} that {who} acks does not exist in the blob store (or is not a regular file); "
            "write it before acking; nothing was recorded"
        )
    if size != w.size:
        return NotWritten(
            f"object {w.key} that {who} acks has {size} bytes in the blob store but the ack says {w.size}; "
            "write it whole before acking; nothing was recorded"
        )
    return None


def blob_rows(job_id: int, cp_id: int, a: SubtaskAck, operator_blob_id, channel_blob_id, now: int) -> list[dict]:
    """The blob rows of a written object: its operator state at its start and its channel state after it."""
    w: WrittenState = a.written
    rows = []
    for blob_id, kind, sha256, offset, size in (
        (operator_blob_id, "operator", w.operator_sha256, 0, w.operator_size),
        (channel_blob_id, "channel", w.channel_sha256, w.operator_size, w.channel_size),
    ):
        if blob_id is None:
            continue
        rows.append(
            {
                "id": blob_id,
                "job_id": job_id,
                "checkpoint_id": cp_id,
                "vertex": a.vertex,
                "subtask_index": a.subtask_index,
                "kind": kind,
                "attempt": a.attempt,
                "sha256": sha256.lower(),
                "size": size,
                "status": "stored",
                "created_at": now,
                "key": w.key,
                "offset": offset,
            }
        )
    return rows


def blob_ids(w: WrittenState) -> tuple[str | None, str | None]:
    """The blob ids of the parts of a written object that hold state (operator, channel): derived from the object's
    key (which names its job and checkpoint) and the part, so the rows of a second ack naming the same object
    collide with the first's, and the committer refuses it (`object_taken`)."""

    def derived(kind: str) -> str:
        return hashlib.sha256(f"{w.key}#{kind}".encode()).hexdigest()[:32]

    return (derived("operator") if w.operator_size > 0 else None, derived("channel") if w.channel_size > 0 else None)


def object_taken(a: SubtaskAck, cp_id: int, owner: tuple[str, int]) -> DomainError:
    """The refusal of an ack naming an object another subtask's ack of the checkpoint named."""
    return Conflict(
        f"subtask {a.vertex}[{a.subtask_index}] acks object {a.written.key}, which subtask {owner[0]}[{owner[1]}] "
        f"acked for checkpoint {cp_id}; each subtask acks the object it wrote; nothing was recorded"
    )


# ====================================================================================== incremental channel state

_CHECKPOINT_OF_KEY = re.compile(r"^job-([0-9]+)/cp-([0-9]+)/")


def _references(a: SubtaskAck) -> list[SegmentPart]:
    return [p for seg in a.channel_segments for p in seg.references()]


def reference_refusal(job_id: int, cp_id: int, a: SubtaskAck) -> DomainError | None:
    """Why the ack's channel state may never reference the objects it names, or None: only an ack with written
    state references, and only objects under an earlier checkpoint's prefix of its own job (another job's key is
    refused outright and never looked up)."""
    refs = _references(a)
    if not refs:
        return None
    who = f"subtask {a.vertex}[{a.subtask_index}]"
    for p in refs:
        m = _CHECKPOINT_OF_KEY.match(p.key or "")
        if m is None or int(m.group(1)) != job_id:
            return Forbidden(
                f"{who}'s channel state references object {p.key!r}, which is not under job {job_id}'s prefix; "
                "nothing was recorded"
            )
        if int(m.group(2)) >= cp_id:
            return Invalid(
                f"{who}'s channel state references object {p.key!r}, which is not under an earlier checkpoint's "
                f"prefix than checkpoint {cp_id}'s; nothing was recorded"
            )
    if a.written is None:
        return Invalid(
            f"{who}'s channel state references earlier objects ({refs[0].key!r}), which only state written "
            "straight into the blob store may do; send the buffers themselves; nothing was recorded"
        )
    return None


Referenced = dict[str, tuple[BlobRow, str, bool]]
"""key -> (its channel blob, its checkpoint's status, whether an ack of that checkpoint names the blob)."""


async def referenced_blobs(s: AsyncSession, job_id: int, acks: list[SubtaskAck]) -> Referenced:
    """The channel blob of each object the acks' channel state references, with its checkpoint's status and whether
    an ack of that checkpoint names it (read under the job row lock, so no release runs between this check and the
    references' insert)."""
    keys = {p.key for a in acks for p in _references(a)}
    if not keys:
        return {}
    acked = (
        select(AckRow.subtask_index)
        .where(
            AckRow.job_id == BlobRow.job_id,
            AckRow.checkpoint_id == BlobRow.checkpoint_id,
            AckRow.channel_blob_id == BlobRow.id,
        )
        .exists()
    )
    rows = await s.execute(
        select(BlobRow, CheckpointRow.status, acked)
        .join(CheckpointRow, (CheckpointRow.job_id == BlobRow.job_id) & (CheckpointRow.id == BlobRow.checkpoint_id))
        .where(BlobRow.job_id == job_id, BlobRow.kind == "channel", BlobRow.key.in_(keys))
    )
    return {b.key: (b, status, bool(named)) for b, status, named in rows}


def check_references(job_id: int, cp_id: int, a: SubtaskAck, found: Referenced, savepoint: bool = False) -> None:
    """Every object the ack references holds channel state an ack of a completed checkpoint of the job named, that
    is still kept, and every range lies within it; else the ack is refused (422) naming the object. (A blob no ack
    names is collected once its checkpoint's late writes are over, whatever references it.)"""
    refusal = reference_refusal(job_id, cp_id, a)
    if refusal is not None:
        raise refusal
    who = f"subtask {a.vertex}[{a.subtask_index}]"
    refs = _references(a)
    if savepoint and refs:
        raise Invalid(
            f"{who}'s channel state for savepoint {cp_id} references object {refs[0].key}; a savepoint holds its "
            "state whole (it is never collected, and would hold the checkpoints it references for good): write "
            "those buffers into its own object; nothing was recorded"
        )
    for p in refs:
        hit = found.get(p.key)
        if hit is None:
            raise Invalid(
                f"{who}'s channel state references object {p.key}, which holds no channel state this coordinator "
                f"recorded for job {job_id}; write those buffers again; nothing was recorded"
            )
        blob, status, named = hit
        if status == CheckpointStatus.completed.value and not named:
            raise Invalid(
                f"{who}'s channel state references object {p.key}, which no ack of checkpoint {blob.checkpoint_id} "
                "names (it is collected with that checkpoint's unacked objects); write those buffers again; nothing "
                "was recorded"
            )
        if status != CheckpointStatus.completed.value or blob.status != "stored":
            state = "no longer kept" if status == CheckpointStatus.completed.value else status.lower()
            raise Invalid(
                f"{who}'s channel state references object {p.key} of checkpoint {blob.checkpoint_id}, which is "
                f"{state}; write those buffers again; nothing was recorded"
            )
        if p.offset + p.length > blob.size:
            raise Invalid(
                f"{who}'s channel state references bytes {p.offset}..{p.offset + p.length - 1} of object {p.key}'s "
                f"channel state, which has {blob.size} bytes; nothing was recorded"
            )


def segments_with_blob_ids(segments: list[dict], found: Referenced) -> list[dict]:
    """The ack's segments as recorded: each referencing part names the blob that holds it (restore plans)."""
    for seg in segments:
        for p in seg.get("parts") or []:
            if p.get("key") is not None and p["key"] in found:
                p["blob_id"] = found[p["key"]][0].id
    return segments


def reference_rows(job_id: int, cp_id: int, a: SubtaskAck) -> list[dict]:
    """One row per earlier object the ack's channel state references: its checkpoint is kept while this one is."""
    keys = dict.fromkeys(p.key for p in _references(a))
    return [
        {
            "job_id": job_id,
            "checkpoint_id": cp_id,
            "vertex": a.vertex,
            "subtask_index": a.subtask_index,
            "key": key,
            "ref_checkpoint_id": int(_CHECKPOINT_OF_KEY.match(key).group(2)),  # type: ignore[union-attr]
        }
        for key in keys
    ]
