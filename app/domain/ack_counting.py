"""Counting and completing, the ack commit's last steps (`app.domain.acks`): what a checkpoint's inserted acks mean
for it (`classify`), their sums added to its row in one statement, and its completion in the same transaction
when every subtask has acked."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import CheckpointRow
from app.domain import ack_store
from app.domain.ack_batch import CheckpointBatch, Counted, Inserted, Outcome
from app.domain.ack_store import CheckpointFacts
from app.domain.completion import complete_checkpoint
from app.domain.lifecycle import COMPLETED


def classify(facts: CheckpointFacts, inserted: Inserted) -> Outcome:
    """From the acks counted when the locks were taken (`facts.num_acked`, as the transaction that held the locks
    before left it) and the acks inserted now."""
    if not inserted.rows:
        return Outcome.NOTHING_NEW
    if facts.num_acked + len(inserted.rows) == facts.num_subtasks:
        return Outcome.COMPLETES
    return Outcome.COUNTED


async def count_and_complete(
    s: AsyncSession, cp: CheckpointBatch, outcome: Outcome, inserted: Inserted, now: int
) -> Counted:
    """Add the inserted acks' sums to the checkpoint's row and complete the checkpoint when every subtask has
    acked: one statement for the sums (`ack_store.add_acks`), or, for the batch that completes it, the sums added to
    the row completing loads, whose one UPDATE records them with the completion."""
    conn = await s.connection()
    if outcome is Outcome.NOTHING_NEW:
        return Counted(await ack_store.num_acked(conn, cp.job_id, cp.cp_id), cp.facts.status)
    params = batch_sums(cp.job_id, cp.cp_id, list(inserted.rows.values()), now)
    completing = None
    if outcome is Outcome.COMPLETES:
        # The rows to complete and the facts completing reads, in one round trip (read now: the count read with the
        # lock may predate a commit the lock waited for), the batch's sums added to the loaded row, whose one
        # UPDATE at the flush records them with the completion. Under the job row lock nothing else changes the
        # row meanwhile. Rows read with both locks (`preloaded`) are current already; whether the job has
        # references counts this batch's.
        if cp.preloaded is not None:
            completing = cp.preloaded._replace(referenced=cp.preloaded.referenced or inserted.references_added)
        else:
            completing = await ack_store.completing_rows(s, cp.job_id, cp.cp_id)
        add_to_row(completing.checkpoint, params)
        num_acked = completing.checkpoint.num_acked
    else:
        num_acked = await ack_store.add_acks(conn, params)
        if num_acked == cp.facts.num_subtasks:  # a guard: the count read with the locks counts every committed ack
            completing = await ack_store.completing_rows(s, cp.job_id, cp.cp_id)
    if completing is None or num_acked != cp.facts.num_subtasks:
        return Counted(num_acked, cp.facts.status)
    await complete_checkpoint(
        s, completing.job, completing.checkpoint, now,
        older_pending=completing.older_pending, referenced=completing.referenced,
    )
    return Counted(num_acked, COMPLETED)


def batch_sums(job_id: int, cp_id: int, rows: list[dict], now: int) -> dict:
    """The parameters of `ack_store.add_acks`: the inserted ack rows' sums and maxima."""
    return {
        "b_job": job_id,
        "b_cp": cp_id,
        "b_acked": len(rows),
        "b_state": sum(r["state_size"] for r in rows),
        "b_persisted": sum(r["persisted_data"] for r in rows),
        "b_processed": sum(r["processed_data"] for r in rows),
        "b_longest": max(r["alignment_duration"] for r in rows),
        "b_start_delay": max(r["start_delay"] for r in rows),
        "b_unaligned": any(r["unaligned"] for r in rows),
        "b_num_unaligned": sum(1 for r in rows if r["unaligned"]),
        "b_over_budget": sum(1 for r in rows if r["aligned_over_budget"]),
        "b_now": now,
    }


def add_to_row(cp: CheckpointRow, p: dict) -> None:
    """`ack_store.add_acks` on a loaded checkpoint row (the batch that completes it): the same sums."""
    cp.num_acked += p["b_acked"]
    cp.state_size += p["b_state"]
    cp.persisted_data += p["b_persisted"]
    cp.processed_data += p["b_processed"]
    if cp.alignment_duration is None or p["b_longest"] >= cp.alignment_duration:
        cp.alignment_duration = p["b_longest"]
    if cp.start_delay is None or p["b_start_delay"] >= cp.start_delay:
        cp.start_delay = p["b_start_delay"]
    cp.any_unaligned = bool(cp.any_unaligned) or p["b_unaligned"]
    cp.num_unaligned = (cp.num_unaligned or 0) + p["b_num_unaligned"]
    cp.num_over_budget = (cp.num_over_budget or 0) + p["b_over_budget"]
    cp.latest_ack_ts = p["b_now"]
