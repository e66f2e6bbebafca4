"""The adaptive barrier policy: per checkpoint, aligned or unaligned, chosen from what the coordinator saw.

Aligned checkpoints persist no in-flight data but wait, at every shuffle, behind every queued buffer; unaligned ones
do not wait but persist what is in flight. Which is cheaper depends on backpressure, and backpressure comes and goes.
The rule, in order (the first that applies decides; its reason is recorded with the checkpoint):

1. Backpressure known and at least ``HIGH_BACKPRESSURE`` on some subtask (from the live metrics this coordinator
   replica received in the last seconds): **unaligned** — an aligned barrier would queue behind full buffers.
2. No finished checkpoint of the job yet: **aligned**, switching to unaligned after the budget.
3. The newest finished checkpoint failed (expired or declined): **unaligned**.
4. The newest finished checkpoint was aligned but had to switch after the budget, or its alignment took at least half
   the budget: **unaligned** — the next alignment is likely to run out.
5. The newest finished checkpoint was unaligned from the start: back to **aligned** only when it persisted at most
   ``CALM_BYTES_PER_SUBTASK`` per subtask (its channels were nearly empty, so alignment is quick) and backpressure, if
   known, is below ``LOW_BACKPRESSURE``; otherwise stay **unaligned**.
6. Otherwise **aligned**: alignment has been well within the budget.

"Aligned" always means aligned-then-unaligned with the budget as its alignment timeout, so a checkpoint chosen
aligned whose backpressure arrives after the decision still switches instead of expiring. The budget is the job's
``checkpoint.alignment_timeout`` (default ``DEFAULT_BUDGET_MS``, at most half the checkpoint timeout). The gap between
the two backpressure thresholds and the persisted-bytes test keep the choice from flapping on every checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.models import BarrierPolicy, PolicyDecision

HIGH_BACKPRESSURE = 0.5
"""Share of time a subtask waited for output room above which alignment is not tried."""
LOW_BACKPRESSURE = 0.2
"""Below this (or unknown) an unaligned phase may end."""
CALM_BYTES_PER_SUBTASK = 64 * 1024
"""Persisted in-flight bytes per subtask under which channels count as nearly empty (two 32 KiB buffers)."""
DEFAULT_BUDGET_MS = 1000
"""Alignment budget when the job sets no ``alignment_timeout``."""


@dataclass(frozen=True)
class Seen:
    """One finished (completed or failed) checkpoint of the job, as the adaptive rule needs it."""

    id: int
    failed: str | None = None
    """'expired' or 'declined' when it failed; None when it completed."""
    unaligned: bool = False
    """It persisted in-flight data (started unaligned or switched)."""
    switched: bool = False
    """It started aligned and switched to unaligned."""
    alignment_duration: int | None = None
    persisted_data: int = 0
    num_subtasks: int = 1


@dataclass(frozen=True)
class Observations:
    history: tuple[Seen, ...] = ()
    """Finished checkpoints of the job, newest first."""
    backpressure: float | None = None
    """Highest backpressure over the job's subtasks' recent live metrics; None when this replica has none."""


def budget_ms(alignment_timeout: int | None, timeout: int) -> int:
    if alignment_timeout is not None:
        return alignment_timeout
    return min(DEFAULT_BUDGET_MS, timeout // 2)


def _bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{n / 1024:.0f} KiB"
    return f"{n / (1024 * 1024):.1f} MiB"


def decide(seen: Observations, budget: int) -> PolicyDecision:
    """Aligned (with the budget as alignment timeout) or unaligned for the next checkpoint, and why."""
    bp = seen.backpressure
    last = seen.history[0] if seen.history else None

    def chose(policy: BarrierPolicy, reason: str) -> PolicyDecision:
        return PolicyDecision(
            requested=BarrierPolicy.adaptive,
            chosen=policy,
            reason=reason,
            budget=budget,
            backpressure=bp,
            based_on=last.id if last else None,
        )

    aligned, unaligned = BarrierPolicy.aligned_then_unaligned, BarrierPolicy.unaligned
    if bp is not None and bp >= HIGH_BACKPRESSURE:
        return chose(unaligned, f"backpressure {bp:.2f} ≥ {HIGH_BACKPRESSURE}: an aligned barrier would queue behind "
                                "full buffers")
    if last is None:
        return chose(aligned, f"no finished checkpoint yet: align, switching to unaligned after {budget} ms")
    if last.failed:
        return chose(unaligned, f"checkpoint {last.id} failed ({last.failed})")
    if last.switched:
        return chose(unaligned, f"checkpoint {last.id} could not align within the {budget} ms budget")
    if not last.unaligned:
        took = last.alignment_duration or 0
        if took * 2 >= budget:
            return chose(unaligned, f"checkpoint {last.id} aligned in {took} ms, at least half the {budget} ms budget")
        return chose(aligned, f"checkpoint {last.id} aligned in {took} ms, well within the {budget} ms budget")
    per_subtask = last.persisted_data // max(1, last.num_subtasks)
    if per_subtask > CALM_BYTES_PER_SUBTASK:
        return chose(unaligned, f"checkpoint {last.id} persisted {_bytes(per_subtask)} of in-flight data per subtask: "
                                "channels are still full")
    if bp is not None and bp >= LOW_BACKPRESSURE:
        return chose(unaligned, f"backpressure {bp:.2f} has not dropped below {LOW_BACKPRESSURE} yet")
    return chose(aligned, f"checkpoint {last.id} persisted only {_bytes(per_subtask)} per subtask: channels are "
                          f"nearly empty, align again (switching after {budget} ms)")
