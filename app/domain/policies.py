"""The coordinator's side of each barrier policy, one rule per policy: what a checkpoint of that policy carries to
the subtasks (the alignment timeout) and whether, and when, the coordinator tells them to switch to unaligned.

Adding a barrier policy means one `BarrierPolicy` value in `contract/models/config.py`, its first barrier state in the
runtime, and one rule here (a test fails while a policy has no rule). A policy the coordinator resolves per checkpoint
(adaptive) needs no runtime state: its plan names the policy the barriers carry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from app.domain.adaptive import Observations, budget_ms, decide
from contract.models import BarrierPolicy, CheckpointConfig, PolicyDecision


@dataclass(frozen=True)
class BarrierPlan:
    """What the coordinator records and announces for one checkpoint."""

    policy: BarrierPolicy
    alignment_timeout: int | None = None
    """Sent with the trigger: ms after it at which subtasks stop aligning (None: not this policy's business)."""
    switch_after: int | None = None
    """ms after the trigger at which the coordinator publishes `checkpoint.switch_to_unaligned` (None: never)."""
    decision: PolicyDecision | None = None
    """For a policy the coordinator resolves per checkpoint: what it chose and why."""


class PolicyRule:
    policy: ClassVar[BarrierPolicy]
    takes_alignment_timeout: ClassVar[bool] = False
    """Whether `checkpoint.alignment_timeout` means anything for this policy (config validation refuses it if not)."""
    observes: ClassVar[bool] = False
    """Whether its plan depends on the job's recent checkpoints and backpressure (`Observations`)."""
    takes_inflight_budget: ClassVar[bool] = True
    """Whether its checkpoints can persist in-flight data, so an in-flight budget limits them."""
    no_inflight_budget: ClassVar[str] = "persists none"
    """Why an in-flight budget means nothing for it (config validation says so when one is set)."""

    def plan(self, cfg: CheckpointConfig, seen: Observations | None = None) -> BarrierPlan:
        return BarrierPlan(self.policy)


class Aligned(PolicyRule):
    """Subtasks block each channel on its barrier until all arrived; nothing to announce."""

    policy = BarrierPolicy.aligned
    takes_inflight_budget = False


class Unaligned(PolicyRule):
    """Barriers overtake buffers from the first one on; nothing to announce."""

    policy = BarrierPolicy.unaligned


class UnalignedLastBarrier(PolicyRule):
    """Barriers overtake the input queues they arrive in, each subtask snapshots on its last barrier and forwards in
    band; nothing to announce. No in-flight budget: a subtask learns what its barriers overtook only as each one
    arrives, after the earlier ones blocked their channels, so there is no point at which it could still finish
    aligned instead."""

    policy = BarrierPolicy.unaligned_last_barrier
    takes_inflight_budget = False
    no_inflight_budget = (
        "decides nothing before its last barrier, when the overtaken inputs can no longer be processed instead"
    )


class AlignedThenUnaligned(PolicyRule):
    """Aligned until the alignment timeout, then unaligned: the timeout travels with the trigger, and the
    coordinator announces the switch when the checkpoint is still pending then. With a zero timeout the barrier
    itself says 'unaligned from the start' and no switch is announced."""

    policy = BarrierPolicy.aligned_then_unaligned
    takes_alignment_timeout = True

    def plan(self, cfg: CheckpointConfig, seen: Observations | None = None) -> BarrierPlan:
        timeout = cfg.alignment_timeout if cfg.alignment_timeout is not None else 0
        return BarrierPlan(self.policy, alignment_timeout=timeout, switch_after=timeout or None)


class Adaptive(PolicyRule):
    """Per checkpoint, aligned (with the alignment budget as its timeout) or unaligned, by the rule in
    `app.domain.adaptive`; the barriers carry the chosen policy, and the checkpoint records the decision."""

    policy = BarrierPolicy.adaptive
    takes_alignment_timeout = True
    observes = True

    def plan(self, cfg: CheckpointConfig, seen: Observations | None = None) -> BarrierPlan:
        budget = budget_ms(cfg.alignment_timeout, cfg.timeout)
        decision = decide(seen or Observations(), budget)
        if decision.chosen == BarrierPolicy.unaligned:
            return BarrierPlan(BarrierPolicy.unaligned, decision=decision)
        timeout = decision.budget  # the budget, or the shorter one learned for a calm guess
        return BarrierPlan(decision.chosen, alignment_timeout=timeout, switch_after=timeout or None, decision=decision)


POLICY_RULES: dict[BarrierPolicy, PolicyRule] = {
    rule.policy: rule
    for rule in (Aligned(), Unaligned(), UnalignedLastBarrier(), AlignedThenUnaligned(), Adaptive())
}


def barrier_plan(policy: BarrierPolicy, cfg: CheckpointConfig, seen: Observations | None = None) -> BarrierPlan:
    return POLICY_RULES[policy].plan(cfg, seen)


def inflight_budget(policy: BarrierPolicy, cfg: CheckpointConfig, num_subtasks: int) -> int | None:
    """The in-flight bytes each subtask may persist for one checkpoint of ``policy``: the smaller of the per-subtask
    budget and the job's shared equally by its subtasks (None: no limit, or a policy that persists none)."""
    if not POLICY_RULES[policy].takes_inflight_budget:
        return None
    budgets = [b for b in (cfg.max_inflight_bytes_per_subtask,) if b is not None]
    if cfg.max_inflight_bytes is not None:
        budgets.append(cfg.max_inflight_bytes // max(1, num_subtasks))
    return min(budgets, default=None)
