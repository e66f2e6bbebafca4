"""Admitting acks, the ack commit's first step (`app.domain.acks`): each ack checked against the job and checkpoint
rows read under the locks (its task token's attempt, its subtask and key groups, the lifecycle's rules for the
checkpoint's state, the blobs or written object it names); and, once the insert showed which subtasks had acked
before, the acks not inserted answered: one repeating the recorded ack idempotently, a different one 409."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import BlobRow
from app.domain import ack_store, lifecycle, written
from app.domain.ack_batch import AckItem, Admitted, CheckpointBatch, Inserted, SubtaskKey
from app.domain.ack_store import LockedJob
from app.domain.checkpoints import check_parallelism
from app.domain.context import now_ms
from app.domain.jobs import token_refusal
from app.domain.lifecycle import PENDING, Prior, SubtaskRequest, Verdict, belongs_to_attempt
from app.errors import Conflict, DomainError, Invalid, Unauthorized
from contract.models import SubtaskAck


def admit_tokens(job_id: int, locked: LockedJob, items: list[AckItem]) -> list[AckItem]:
    """The acks whose task token may ack now: a token works only while its attempt is current (checked under the
    job row lock). The others are answered 401."""
    admitted = []
    for it in items:
        refusal = None
        if it.token_attempt is not None:
            refusal = token_refusal(job_id, it.token_attempt, locked.current_attempt, locked.status)
        if refusal is None:
            admitted.append(it)
        else:
            it.result = Unauthorized(refusal)
    return admitted


async def admit(s: AsyncSession, cp: CheckpointBatch) -> Admitted:
    """The acks that may be recorded into the checkpoint; each refused one gets its error as its answer. Before the
    insert it is not known whether a subtask acked before: a pending checkpoint takes the ack (the insert finds
    out); a finished one takes none, and the acks that belong to its attempt are answered after the insert
    (`settle`)."""
    facts, pending = cp.facts, cp.facts.status == PENDING
    blob_ids = {
        ref.blob_id for it in cp.items for ref in (it.ack.operator_state, it.ack.channel_state) if ref is not None
    }
    blobs: dict[str, BlobRow] = {}
    if blob_ids and pending:  # blobs of a finished checkpoint may be released; only new acks need them
        blobs = await ack_store.stored_blobs(s, blob_ids)
    referenced: written.Referenced = {}
    if pending:
        referenced = await written.referenced_blobs(s, cp.job_id, [it.ack for it in cp.items])
    now = now_ms()
    rules = _RuleFacts(cp.job_id, cp.cp_id, facts.attempt, facts.status, facts.failure_reason)
    candidates: dict[SubtaskKey, AckItem] = {}
    repeats: list[AckItem] = []  # a second ack for a subtask within this batch
    for it in cp.items:
        a = it.ack
        try:
            check_parallelism(cp.job_id, cp.graph, a.vertex, a.subtask_index)
            _check_key_groups(a, cp.key_groups[a.vertex])
            if it.subtask in candidates:
                repeats.append(it)
                continue
            if pending:
                lifecycle.accept(rules, _request(a))
                if it.missing is not None:
                    raise it.missing
                _check_blobs(cp.job_id, cp.cp_id, a, blobs)
                written.check_references(cp.job_id, cp.cp_id, a, referenced, facts.is_savepoint)
            else:
                belongs_to_attempt(a.attempt, facts.attempt, f"checkpoint {cp.cp_id}", "this ack")
        except DomainError as exc:
            it.result = exc
            continue
        candidates[it.subtask] = it
    return Admitted(candidates, repeats, referenced, now)


async def settle(s: AsyncSession, cp: CheckpointBatch, admitted: Admitted, inserted: Inserted) -> set[int]:
    """Answer the admitted acks that were not inserted (their subtask acked before, or the checkpoint is over) and
    the repeats within the batch, by the lifecycle's rules with the ack recorded before: the ids of those that
    repeat it (a retried ack: answered as recorded, `duplicate`); a different one is refused (409)."""
    others = [k for k in admitted.candidates if k not in inserted.rows] + [
        it.subtask for it in admitted.repeats if it.result is None
    ]
    existing = await ack_store.recorded_hashes(s, cp.job_id, cp.cp_id, others) if others else {}
    rules = _RuleFacts(cp.job_id, cp.cp_id, cp.facts.attempt, cp.facts.status, cp.facts.failure_reason)
    duplicates: set[int] = set()
    for it in [*admitted.candidates.values(), *admitted.repeats]:
        key = it.subtask
        if it.result is not None or (key in inserted.rows and it is admitted.candidates[key]):
            continue
        recorded = existing.get(key) or (inserted.rows[key]["content_hash"] if key in inserted.rows else None)
        prior = None if recorded is None else ("same" if recorded == it.digest else "different")
        try:
            if lifecycle.accept(rules, _request(it.ack, prior)) == Verdict.unchanged:
                duplicates.add(id(it))
            else:  # pragma: no cover - a pending checkpoint without the ack would have taken the insert
                it.result = Conflict(f"checkpoint {cp.cp_id} could not record the ack of {key[0]}[{key[1]}]; retry")
        except DomainError as exc:
            it.result = exc
    return duplicates


@dataclass(frozen=True)
class _RuleFacts:
    """The columns of a checkpoint the lifecycle's rules read (the ack path selects only these)."""

    job_id: int
    id: int
    attempt: int
    status: str
    failure_reason: str | None


def _request(a: SubtaskAck, prior: Prior = None) -> SubtaskRequest:
    return SubtaskRequest("ack", a.attempt, f"{a.vertex}[{a.subtask_index}]", prior)


def _check_key_groups(a: SubtaskAck, max_parallelism: int) -> None:
    """422 unless the key groups an ack says its state holds are among its vertex's (`max_parallelism` of them): a
    restore plan hands them to the subtasks that restore it."""
    if a.key_group_end is not None and a.key_group_end >= max_parallelism:
        raise Invalid(
            f"subtask {a.vertex}[{a.subtask_index}] acks key groups {a.key_group_start}..{a.key_group_end}, but vertex "
            f"{a.vertex!r} has {max_parallelism} key groups (0..{max_parallelism - 1}); nothing was recorded"
        )


def _check_blobs(job_id: int, cp_id: int, a: SubtaskAck, blobs: dict[str, BlobRow]) -> None:
    """422 unless the uploaded blobs the ack names are stored, for this subtask of this checkpoint, as it says."""
    for kind, ref in (("operator", a.operator_state), ("channel", a.channel_state)):
        if ref is None:
            continue
        b = blobs.get(ref.blob_id)
        where = f"checkpoint {cp_id} subtask {a.vertex}[{a.subtask_index}]"
        if b is None or b.status != "stored":
            raise Invalid(f"{kind} blob {ref.blob_id} is not stored; upload it for {where} before acking")
        if (b.job_id, b.checkpoint_id, b.vertex, b.subtask_index, b.kind) != (
            job_id,
            cp_id,
            a.vertex,
            a.subtask_index,
            kind,
        ):
            raise Invalid(
                f"{kind} blob {ref.blob_id} was uploaded for checkpoint {b.checkpoint_id} subtask "
                f"{b.vertex}[{b.subtask_index}] ({b.kind}), not for {where}"
            )
        if b.sha256 != ref.sha256.lower() or b.size != ref.size:
            raise Invalid(
                f"{kind} blob {ref.blob_id} is stored with sha256 {b.sha256} and size {b.size}; "
                f"the ack says {ref.sha256} and {ref.size}"
            )
