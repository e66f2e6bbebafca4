"""The checkpoint and job state machines: every legal transition, written as small named rules.

A checkpoint is PENDING until it is COMPLETED (every subtask of its attempt acked, in the same
transaction as the last ack) or ABORTED with a reason. Nothing leaves COMPLETED or ABORTED.
A job is CREATED, RUNNING (an attempt is open) or FAILING (too many consecutive failed checkpoints)
until it ends as FINISHED, FAILED or CANCELLED.

Every state change of a checkpoint or a job in the coordinator goes through `complete`, `abort`,
or `move_job` below; the rules here are the only place that decides whether it is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from app.db.models import CheckpointRow, JobRow
from app.errors import Conflict
from client.models import CheckpointStatus, JobStatus

PENDING = CheckpointStatus.pending.value
COMPLETED = CheckpointStatus.completed.value
ABORTED = CheckpointStatus.aborted.value


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
