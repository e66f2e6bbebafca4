"""The checkpoint and job state machines: every legal transition and what each state still accepts, written as
small named rules, and the transitions that apply them.

A checkpoint is PENDING until it is COMPLETED (every subtask of its attempt acked, in the same
transaction as the last ack) or ABORTED with a reason. Nothing leaves COMPLETED or ABORTED.
A job is CREATED, RUNNING (an attempt is open) or FAILING (too many consecutive failed checkpoints)
until it ends as FINISHED, FAILED or CANCELLED.

Every state change of a checkpoint or a job in the coordinator goes through `complete`, `abort_checkpoint`,
`end_job` or `move_job` below; every request a subtask sends about a checkpoint (an ack, an upload, a decline,
also late or repeated) is decided by `accept`. The rules here are the only place that decides whether either is
allowed. Whether a request belongs to the attempt it names is decided once, by `belongs_to_attempt`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal, Protocol

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AttemptRow, CheckpointRow, JobRow
from app.domain import cleanup
from app.domain.context import after_commit
from app.errors import Conflict
from app.events import emit
from app.observability import CHECKPOINTS
from contract.events import CheckpointAborted, JobStatusChanged
from contract.models import CheckpointStatus, JobStatus

PENDING = CheckpointStatus.pending.value
COMPLETED = CheckpointStatus.completed.value
ABORTED = CheckpointStatus.aborted.value
ACTIVE = (JobStatus.running.value, JobStatus.failing.value)


class AbortReason(str, Enum):
    """Why a checkpoint was aborted. `counts_as_failure` ones count toward `tolerable_failures`."""

    expired = "expired"
    declined = "declined"
    subsumed = "subsumed"
    new_attempt = "new_attempt"
    job_cancelled = "job_cancelled"
    job_ended = "job_ended"

    @property
    def counts_as_failure(self) -> bool:
        return self in (AbortReason.expired, AbortReason.declined)


# --------------------------------------------------------------------------- one attempt at a time


def belongs_to_attempt(sent: int | None, owner_attempt: int | None, owner: str, request: str) -> None:
    """409 unless a request from attempt `sent` belongs to `owner` (a checkpoint, or a job's current attempt),
    which is of attempt `owner_attempt`. `request` says what the request wants, e.g. 'this ack'."""
    if sent != owner_attempt:
        raise Conflict(
            f"{owner} belongs to attempt {owner_attempt}; {request} is from attempt {sent}"
            + ("" if owner_attempt is None else f" (only attempt {owner_attempt} may send it)")
        )


def check_current_attempt(job: JobRow, attempt: int | None, request: str) -> None:
    """409 unless `attempt` (None: the current one) is the job's current attempt."""
    if attempt is not None:
        belongs_to_attempt(attempt, job.current_attempt, f"job {job.id}'s current run", request)


# --------------------------------------------------------------------------- what a checkpoint accepts


class CheckpointFacts(Protocol):
    """What the rules read of a checkpoint (a CheckpointRow, or the columns the ack path selects)."""

    job_id: int
    id: int
    attempt: int
    status: str
    failure_reason: str | None


RequestKind = Literal["ack", "upload", "decline"]
Prior = Literal["same", "different"] | None


@dataclass(frozen=True)
class SubtaskRequest:
    """A subtask's request about a checkpoint. `prior`: what this subtask recorded for the checkpoint before with
    this request's kind: nothing (None), the same content (a retry), or different content."""

    kind: RequestKind
    attempt: int
    subtask: str
    prior: Prior = None


class Verdict(str, Enum):
    apply = "apply"  # record it
    unchanged = "unchanged"  # a late or repeated request: answer success, change nothing


class AcceptRule:
    """One decision about a request; returns a verdict, None to leave it to the next rule, or raises Conflict."""

    def decide(self, cp: CheckpointFacts, req: SubtaskRequest) -> Verdict | None:  # pragma: no cover - interface
        raise NotImplementedError


class FromTheCheckpointsAttempt(AcceptRule):
    """Only the attempt that took a checkpoint may ack, upload for or decline it."""

    def decide(self, cp, req):
        belongs_to_attempt(req.attempt, cp.attempt, f"checkpoint {cp.id}", f"this {req.kind}")
        return None


class RepeatsChangeNothing(AcceptRule):
    """The same ack or upload again succeeds and changes nothing, in any state (a retry after a lost answer)."""

    def decide(self, cp, req):
        return Verdict.unchanged if req.prior == "same" else None


class RecordedContentNeverChanges(AcceptRule):
    """A different ack or upload for a subtask that already sent one is refused: what is recorded stays."""

    def decide(self, cp, req):
        if req.prior == "different":
            raise Conflict(
                f"subtask {req.subtask} already sent an {req.kind} for checkpoint {cp.id} with different content; "
                + ("a blob cannot be replaced" if req.kind == "upload" else f"an {req.kind} cannot be changed")
            )
        return None


class PendingTakesWork(AcceptRule):
    """A pending checkpoint takes acks, uploads and declines."""

    def decide(self, cp, req):
        return Verdict.apply


class AbortedTakesNoWork(AcceptRule):
    """An aborted checkpoint takes no acks or uploads (the subtask discards its state); a decline of it changes
    nothing (it is aborted already)."""

    def decide(self, cp, req):
        if req.kind == "decline":
            return Verdict.unchanged
        raise Conflict(f"checkpoint {cp.id} was aborted ({cp.failure_reason}); discard its state")


class CompletedTakesNoWork(AcceptRule):
    """A completed checkpoint takes no new ack, upload or decline."""

    def decide(self, cp, req):
        if req.kind == "decline":
            raise Conflict(f"checkpoint {cp.id} is already COMPLETED; it cannot be declined")
        raise Conflict(
            f"checkpoint {cp.id} is already COMPLETED without an {req.kind} of {req.subtask}; "
            f"it takes no more {req.kind}s"
        )


_ALWAYS = [FromTheCheckpointsAttempt(), RepeatsChangeNothing(), RecordedContentNeverChanges()]
ACCEPT_RULES: dict[str, list[AcceptRule]] = {
    PENDING: [*_ALWAYS, PendingTakesWork()],
    ABORTED: [*_ALWAYS, AbortedTakesNoWork()],
    COMPLETED: [*_ALWAYS, CompletedTakesNoWork()],
}


def accept(cp: CheckpointFacts, req: SubtaskRequest) -> Verdict:
    """What the checkpoint does with the request in its current state: apply it, or answer and change nothing;
    raises Conflict (saying why) when it refuses."""
    for rule in ACCEPT_RULES[cp.status]:
        verdict = rule.decide(cp, req)
        if verdict is not None:
            return verdict
    raise AssertionError(f"no rule decided {req} for a {cp.status} checkpoint")  # pragma: no cover


# --------------------------------------------------------------------------- checkpoint rules


class CheckpointRule:
    """One condition a checkpoint transition must satisfy; raises Conflict when it does not."""

    def check(self, cp: CheckpointRow, target: str) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class PreventLeavingTerminalState(CheckpointRule):
    def check(self, cp: CheckpointRow, target: str) -> None:
        if cp.status == COMPLETED:
            raise Conflict(
                f"checkpoint {cp.id} of job {cp.job_id} is already COMPLETED; it cannot become {target}"
            )
        if cp.status == ABORTED:
            raise Conflict(
                f"checkpoint {cp.id} of job {cp.job_id} was aborted ({cp.failure_reason}); it cannot become {target}"
            )


class CompleteOnlyWhenAllAcked(CheckpointRule):
    def check(self, cp: CheckpointRow, target: str) -> None:
        if target == COMPLETED and cp.num_acked != cp.num_subtasks:
            raise Conflict(
                f"checkpoint {cp.id} has {cp.num_acked} of {cp.num_subtasks} acks; it completes only when all acked"
            )


CHECKPOINT_RULES: dict[tuple[str, str], list[CheckpointRule]] = {
    (PENDING, COMPLETED): [PreventLeavingTerminalState(), CompleteOnlyWhenAllAcked()],
    (PENDING, ABORTED): [PreventLeavingTerminalState()],
}


def _check(cp: CheckpointRow, target: str) -> None:
    rules = CHECKPOINT_RULES.get((cp.status, target))
    if rules is None:
        PreventLeavingTerminalState().check(cp, target)
        raise Conflict(f"checkpoint {cp.id} cannot go from {cp.status} to {target}")
    for rule in rules:
        rule.check(cp, target)


def complete(cp: CheckpointRow, job: JobRow, now: int) -> None:
    """PENDING -> COMPLETED. The caller holds the job row lock and commits with the last ack."""
    _check(cp, COMPLETED)
    cp.status = COMPLETED
    cp.completed_ts = now
    if not cp.is_savepoint:
        job.consecutive_failures = 0
        if job.status == JobStatus.failing.value:
            move_job(job, JobStatus.running, "a checkpoint completed again")
    if job.latest_completed_id is None or cp.id > job.latest_completed_id:
        job.latest_completed_id = cp.id
        job.last_completed_at = now
    cleanup.prune_when_late_writes_are_over(cp)


def abort(cp: CheckpointRow, job: JobRow, reason: AbortReason, detail: str, now: int) -> bool:
    """PENDING -> ABORTED(reason). Returns True when the failure made the job FAILING."""
    _check(cp, ABORTED)
    cp.status = ABORTED
    cp.failure_reason = f"{reason.value}: {detail}" if detail else reason.value
    cp.completed_ts = now
    if reason.counts_as_failure and not cp.is_savepoint:
        job.consecutive_failures += 1
        tolerable = int(job.config.get("tolerable_failures", 0))
        if job.consecutive_failures > tolerable and job.status == JobStatus.running.value:
            move_job(
                job,
                JobStatus.failing,
                f"{job.consecutive_failures} consecutive checkpoint failures exceed tolerable_failures={tolerable}; "
                f"last: checkpoint {cp.id} {cp.failure_reason}",
            )
            return True
    return False


async def abort_checkpoint(
    s: AsyncSession,
    job: JobRow,
    cp: CheckpointRow,
    reason: AbortReason,
    detail: str,
    now: int,
    *,
    unreferenced: bool = False,
) -> None:
    """PENDING -> ABORTED with its reason; its blobs are released. The caller holds the job row lock.
    `unreferenced`: the job has no channel state reference (`cleanup.release`)."""
    became_failing = abort(cp, job, reason, detail, now)
    job.updated_at = now
    await cleanup.release(s, job.id, [cp.id], now, unreferenced=unreferenced)  # its blobs go after the commit
    emit(
        s,
        job,
        CheckpointAborted(
            checkpoint_id=cp.id, attempt=cp.attempt, reason=cp.failure_reason, is_savepoint=cp.is_savepoint
        ),
        now,
    )
    if became_failing:
        emit(s, job, JobStatusChanged(status=job.status, message=job.status_message), now)
    after_commit(s, lambda: CHECKPOINTS.labels("aborted").inc())


async def abort_pending(s: AsyncSession, job: JobRow, reason: AbortReason, detail: str, now: int) -> list[int]:
    """Abort every pending checkpoint of the job, oldest first; returns their ids."""
    rows = (
        await s.execute(
            select(CheckpointRow)
            .where(CheckpointRow.job_id == job.id, CheckpointRow.status == PENDING)
            .order_by(CheckpointRow.id)
        )
    ).scalars()
    aborted = []
    for cp in list(rows):
        if cp.status != PENDING:
            continue
        await abort_checkpoint(s, job, cp, reason, detail, now)
        aborted.append(cp.id)
    return aborted


# --------------------------------------------------------------------------- job rules


@dataclass(frozen=True)
class JobTransition:
    source: frozenset[JobStatus]
    target: JobStatus


_ACTIVE = frozenset({JobStatus.created, JobStatus.running, JobStatus.failing})
_ENDED_RESUMABLE = frozenset({JobStatus.finished, JobStatus.failed})
JOB_TRANSITIONS: list[JobTransition] = [
    JobTransition(_ACTIVE, JobStatus.running),  # an attempt starts (also a restart of a failing job)
    # A finished or failed job may be resumed by a new attempt (from its checkpoints); a cancelled one may not.
    JobTransition(_ENDED_RESUMABLE, JobStatus.running),
    JobTransition(frozenset({JobStatus.running}), JobStatus.failing),
    JobTransition(_ACTIVE, JobStatus.finished),
    JobTransition(_ACTIVE, JobStatus.failed),
    JobTransition(_ACTIVE, JobStatus.cancelled),
]


def move_job(job: JobRow, target: JobStatus, message: str | None = None) -> None:
    current = JobStatus(job.status)
    if not any(current in t.source and t.target == target for t in JOB_TRANSITIONS):
        raise Conflict(
            f"job {job.id} is {current.value}; it cannot become {target.value}"
            + (" (it was cancelled; register a new job to run again)" if current == JobStatus.cancelled else "")
        )
    job.status = target.value
    job.status_message = message


async def end_attempt(s: AsyncSession, job: JobRow, now: int) -> None:
    """The job's current attempt is over: its task token stops working."""
    if job.current_attempt is not None:
        await s.execute(
            update(AttemptRow)
            .where(
                AttemptRow.job_id == job.id,
                AttemptRow.number == job.current_attempt,
                AttemptRow.ended_at.is_(None),
            )
            .values(ended_at=now)
        )


async def end_job(
    s: AsyncSession, job: JobRow, status: JobStatus, message: str | None, reason: AbortReason, detail: str, now: int
) -> None:
    """End a job (cancelled, finished or failed by its runtime, or stopped with a savepoint): move it to `status`,
    abort its pending checkpoints with `reason`, end its attempt, and tell its subtasks. The caller holds the
    job row lock."""
    move_job(job, status, message)
    await abort_pending(s, job, reason, detail, now)
    await end_attempt(s, job, now)
    job.updated_at = now
    emit(s, job, JobStatusChanged(status=job.status, message=job.status_message), now)
