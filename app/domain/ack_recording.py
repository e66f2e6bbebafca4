"""Recording acks, the ack commit's second step (`app.domain.acks`): an admitted ack's row, and the insert of the
batch's ack rows with the blob rows of the objects they name and their channel-state references, in the acks'
transaction."""

from __future__ import annotations

import hashlib

from sqlalchemy.ext.asyncio import AsyncConnection

from app.domain import ack_store, written
from app.domain.ack_batch import AckItem, Admitted, CheckpointBatch, Inserted
from app.domain.lifecycle import PENDING
from app.errors import Conflict
from contract.models import SubtaskAck


def ack_hash(ack: SubtaskAck) -> str:
    """The ack's identity for idempotency: its canonical JSON (fields in model order), hashed."""
    return hashlib.sha256(ack.model_dump_json().encode()).hexdigest()


async def insert(conn: AsyncConnection, cp: CheckpointBatch, admitted: Admitted) -> Inserted:
    """Insert the admitted acks of a pending checkpoint, one row per subtask (a subtask that acked before keeps its
    row), then the blob rows and references of those inserted."""
    if not admitted.candidates or cp.facts.status != PENDING:
        return Inserted({})
    rows = {}
    for key, it in admitted.candidates.items():
        row = ack_row(cp.job_id, cp.cp_id, it.ack, it.digest, admitted.now, cp.facts.trigger_ts)
        if admitted.referenced:
            row["segments"] = written.segments_with_blob_ids(row["segments"], admitted.referenced)
        rows[key] = row
    keys = await ack_store.insert_acks(conn, list(rows.values()))
    inserted = {k: row for k, row in rows.items() if k in keys}  # in the batch's order
    recorded = [(admitted.candidates[k], row) for k, row in inserted.items()]
    return Inserted(inserted, await _record_written(conn, cp.job_id, cp.cp_id, recorded, admitted.now))


async def _record_written(
    conn: AsyncConnection, job_id: int, cp_id: int, recorded: list[tuple[AckItem, dict]], now: int
) -> bool:
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
        await ack_store.insert_references(conn, refs)
    if not rows:
        return bool(refs)
    named: dict[str, tuple[str, int]] = {}  # acks of this batch naming one object name the same blob ids
    for it, _ in recorded:
        for b in rows_of.get(id(it), ()):
            owner = named.setdefault(b["id"], it.subtask)
            if owner != it.subtask:
                raise written.object_taken(it.ack, cp_id, owner)
    stored = await ack_store.insert_blobs(conn, rows)
    for it, row in recorded:
        ids = {row["operator_blob_id"], row["channel_blob_id"]} - {None}
        if it.ack.written is not None and not ids <= stored:
            a = it.ack
            owner = await ack_store.blob_owner(conn, ids)
            if owner is not None and owner != it.subtask:
                raise written.object_taken(a, cp_id, owner)
            raise Conflict(
                f"subtask {a.vertex}[{a.subtask_index}] uploaded state for checkpoint {cp_id} through the "
                "coordinator before; an ack names its state either as uploaded blobs or as a written object, "
                "so ack the uploaded blobs"
            )
    return bool(refs)


def ack_time(sent: int | None, trigger_ts: int, now: int) -> int:
    """When a subtask acked, as recorded: the time it sent with its ack (a relayed ack arrives with the others of
    its host, later than it was sent), within [trigger time, arrival] so that a skewed clock cannot place an ack
    before its checkpoint began or after it arrived; the arrival when it sent none."""
    if sent is None:
        return now
    return min(max(sent, trigger_ts), now)


def ack_row(job_id: int, cp_id: int, a: SubtaskAck, digest: str, now: int, trigger_ts: int) -> dict:
    """The ack's row in `acks`."""
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
        "ack_ts": ack_time(m.ack_timestamp, trigger_ts, now),
        "sync_duration": m.sync_duration,
        "async_duration": m.async_duration,
        "alignment_duration": m.alignment_duration,
        "start_delay": m.start_delay,
        "processed_data": m.processed_data,
        "persisted_data": m.persisted_data,
        "state_size": state_size,
        "unaligned": m.unaligned,
        "aligned_over_budget": m.aligned_over_budget and not m.unaligned,
        "operator_blob_id": operator_blob_id,
        "channel_blob_id": channel_blob_id,
        "segments": [seg.model_dump(mode="json") for seg in a.channel_segments],
        "source_offsets": a.source_offsets,
        "key_group_start": a.key_group_start,
        "key_group_end": a.key_group_end,
    }
