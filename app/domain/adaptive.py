"""The adaptive barrier policy: per checkpoint, aligned or unaligned, chosen from what the coordinator saw.

Aligned checkpoints persist no in-flight data but wait, at every shuffle, behind every queued buffer; unaligned ones
do not wait but persist what is in flight. Which is cheaper depends on backpressure, and backpressure comes and goes.
The rule, in order (the first that applies decides; its reason is recorded with the checkpoint):

1. No finished checkpoint of the job yet and no high backpressure: **aligned**, switching to unaligned after the
   budget.
2. The newest finished checkpoint failed (expired or declined): **unaligned**.
3. Calm: backpressure unknown or below ``HIGH_BACKPRESSURE``, and the newest finished checkpoint aligned in less than
   half the budget, or was unaligned but persisted at most ``CALM_BYTES_PER_SUBTASK`` per subtask (its channels were
   nearly empty) with backpressure, if known, below ``LOW_BACKPRESSURE``: **aligned**, switching after the *learned*
   budget.
4. Otherwise the job is under pressure (backpressure of at least ``HIGH_BACKPRESSURE`` on some subtask in the live
   metrics this replica received, an alignment that switched or took at least half the budget, or unaligned
   checkpoints that still persist full channels), and the choice is made from what each choice *achieved* under
   pressure (`pressured`: aligned ones that switched or used half the budget, unaligned ones that persisted in-flight
   data): the end-to-end durations of the last ``SAMPLE`` such completed checkpoints per choice
   among the newest ``HISTORY`` finished ones.

   a. A choice with no such checkpoint there is **tried** (explored): workloads change, and a choice not tried for
      ``HISTORY`` checkpoints is tried again. When both lack one, unaligned is tried first.
   b. Otherwise **unaligned** only when its median is below ``1 - MARGIN`` times aligned's: equal durations favour
      aligned, which persists less. Else **aligned**.

The inputs all come from the database (the checkpoint rows) except the live backpressure, so replicas decide alike;
a replica with no live metrics decides from the checkpoints alone. The rule is a pure function of its inputs.

"Aligned" always means aligned-then-unaligned, so a checkpoint chosen aligned whose backpressure arrives after the
decision still switches instead of expiring. Its alignment timeout is the budget, except in rule 3: a calm guess
switches after the **learned budget**, ``BUDGET_HEADROOM`` times the longest trigger-to-aligned time (start delay
plus alignment) of the job's last ``SAMPLE`` checkpoints that aligned without switching, at least
``MIN_BUDGET_MS`` and at most the budget. A calm phase's alignments take a few milliseconds, so when backpressure
arrives between two checkpoints the one that guessed calm switches after some 10–20 ms instead of running out the
whole budget (which set the policy's p90 before). Under pressure (rule 4) aligning is tried with the whole budget. A
guess that switched counts as what aligning achieved under pressure: its duration (the learned budget plus an
unaligned checkpoint) is never shorter than unaligned's, so it never makes aligning look faster than it is; where
unaligned checkpoints are slow it comes within the margin of them, aligning is chosen, and a checkpoint with the
whole budget shows what aligning achieves. (Leaving guesses out made the wave benchmark try aligning with the whole
budget after nearly every busy phase's guess: p90 36 against unaligned's 22 ms.) The budget is the job's
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
HISTORY = 16
"""Finished checkpoints (newest first) the rule looks at; a choice absent from them is tried again."""
SAMPLE = 5
"""Completed checkpoints per choice whose durations are compared (the newest under pressure)."""
MARGIN = 0.1
"""How much faster (share of aligned's median) unaligned must have been to be chosen over aligned."""
BUDGET_HEADROOM = 2
"""The learned budget: this many times the longest recent trigger-to-aligned time of a calm alignment."""
MIN_BUDGET_MS = 10
"""The learned budget's floor: below it one slow barrier hop would make a calm checkpoint switch."""


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
    start_delay: int | None = None
    """The longest trigger-to-first-barrier time of its subtasks (ms)."""
    persisted_data: int = 0
    num_subtasks: int = 1
    policy: BarrierPolicy | None = None
    """The policy its barriers carried (for an adaptive checkpoint, the one chosen)."""
    duration: int | None = None
    """End to end, trigger to completion (ms); None when it failed."""


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


def _calm_bytes(cp: Seen) -> bool:
    return cp.persisted_data // max(1, cp.num_subtasks) <= CALM_BYTES_PER_SUBTASK


def pressured(cp: Seen, budget: int) -> bool:
    """Whether a completed checkpoint says what its choice achieves under pressure: aligned-then-unaligned that
    switched or used at least half the budget (a quick alignment in a calm phase would make aligning look fast), or
    unaligned that persisted any in-flight data. Unaligned ones are not held to ``CALM_BYTES_PER_SUBTASK``: with
    credit-bounded channels a busy phase's unaligned checkpoint may persist less than that per subtask (the wave
    benchmark: some 16 KiB), and leaving them out made unaligned look untried and tried again and again."""
    if cp.failed or cp.duration is None:
        return False
    if cp.policy == BarrierPolicy.aligned_then_unaligned:
        return cp.switched or (cp.alignment_duration or 0) * 2 >= budget
    if cp.policy == BarrierPolicy.unaligned:
        return cp.persisted_data > 0
    return False


def learned_budget(history: tuple[Seen, ...], budget: int) -> tuple[int, str]:
    """The alignment timeout of a calm guess, and how it was found: ``BUDGET_HEADROOM`` times the longest
    trigger-to-aligned time (start delay plus alignment) of the newest ``SAMPLE`` checkpoints that aligned without
    switching, between ``MIN_BUDGET_MS`` and ``budget``; the budget itself when none aligned."""
    clean = [cp for cp in history if cp.failed is None and cp.duration is not None and not cp.unaligned
             and cp.policy == BarrierPolicy.aligned_then_unaligned][:SAMPLE]
    if not clean:
        return budget, f"switching after the {budget} ms budget"
    took = max((cp.start_delay or 0) + (cp.alignment_duration or 0) for cp in clean)
    learned = min(budget, max(MIN_BUDGET_MS, BUDGET_HEADROOM * took))
    return learned, (f"switching after {learned} ms (the last {len(clean)} alignments took at most {took} ms from "
                     f"the trigger; budget {budget} ms)")


def _median(xs: list[int]) -> float:
    ys = sorted(xs)
    mid = len(ys) // 2
    return float(ys[mid]) if len(ys) % 2 else (ys[mid - 1] + ys[mid]) / 2


def decide(seen: Observations, budget: int) -> PolicyDecision:
    """Aligned (with the budget as alignment timeout) or unaligned for the next checkpoint, and why."""
    bp = seen.backpressure
    history = seen.history[:HISTORY]
    last = history[0] if history else None

    def chose(policy: BarrierPolicy, reason: str, timeout: int = budget) -> PolicyDecision:
        return PolicyDecision(
            requested=BarrierPolicy.adaptive,
            chosen=policy,
            reason=reason,
            budget=timeout,
            backpressure=bp,
            based_on=last.id if last else None,
        )

    aligned, unaligned = BarrierPolicy.aligned_then_unaligned, BarrierPolicy.unaligned
    hot = bp is not None and bp >= HIGH_BACKPRESSURE
    if last is None and not hot:
        return chose(aligned, f"no finished checkpoint yet: align, switching to unaligned after {budget} ms")
    if last is not None and last.failed:
        return chose(unaligned, f"checkpoint {last.id} failed ({last.failed})")
    if last is not None and not hot:
        guess, how = learned_budget(history, budget)
        if not last.unaligned:
            took = last.alignment_duration or 0
            if took * 2 < budget:
                return chose(aligned, f"checkpoint {last.id} aligned in {took} ms, well within the {budget} ms budget: "
                                      f"align, {how}", guess)
        elif not last.switched and _calm_bytes(last) and (bp is None or bp < LOW_BACKPRESSURE):
            per_subtask = last.persisted_data // max(1, last.num_subtasks)
            return chose(aligned, f"checkpoint {last.id} persisted only {_bytes(per_subtask)} per subtask: channels "
                                  f"are nearly empty, align again, {how}", guess)

    # under pressure: choose from what each choice achieved under pressure
    if hot:
        why = f"backpressure {bp:.2f} ≥ {HIGH_BACKPRESSURE}"
    elif last is not None and last.switched:
        why = f"checkpoint {last.id} could not align within the {budget} ms budget"
    elif last is not None and not last.unaligned:
        why = f"checkpoint {last.id} aligned in {last.alignment_duration or 0} ms, at least half the {budget} ms budget"
    elif last is not None and not _calm_bytes(last):
        per_subtask = last.persisted_data // max(1, last.num_subtasks)
        why = f"checkpoint {last.id} persisted {_bytes(per_subtask)} of in-flight data per subtask: channels are still full"
    else:
        why = f"backpressure {bp:.2f} has not dropped below {LOW_BACKPRESSURE} yet"
    samples = {
        choice: [cp for cp in history if cp.policy == choice and pressured(cp, budget)][:SAMPLE]
        for choice in (aligned, unaligned)
    }
    for choice in (unaligned, aligned):
        if not samples[choice]:
            return chose(choice, f"{why}; {choice.value} not tried under pressure in the last {HISTORY} checkpoints: "
                                 "try it")
    a = _median([cp.duration or 0 for cp in samples[aligned]])
    u = _median([cp.duration or 0 for cp in samples[unaligned]])
    figures = (f"under pressure, unaligned took {u:.0f} ms (median of {len(samples[unaligned])}), aligned then "
               f"unaligned {a:.0f} ms (median of {len(samples[aligned])})")
    if u < a * (1 - MARGIN):
        return chose(unaligned, f"{why}; {figures}: unaligned is faster by more than {MARGIN:.0%}")
    return chose(aligned, f"{why}; {figures}: unaligned is not faster by more than {MARGIN:.0%}, align (persists "
                          f"less), switching after {budget} ms")
