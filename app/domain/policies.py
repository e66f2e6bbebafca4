"""The coordinator's side of each barrier policy, one rule per policy: what a checkpoint of that policy carries to
the subtasks (the alignment timeout) and whether, and when, the coordinator tells them to switch to unaligned.

Adding a barrier policy means one `BarrierPolicy` value in `contract/models.py`, its first barrier state in the
runtime, and one rule here (a test fails while a policy has no rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from contract.models import BarrierPolicy, CheckpointConfig


@dataclass(frozen=True)
class BarrierPlan:
    """What the coordinator records and announces for one checkpoint."""

    policy: BarrierPolicy
    alignment_timeout: int | None = None
    """Sent with the trigger: ms after it at which subtasks stop aligning (None: not this policy's business)."""
    switch_after: int | None = None
    """ms after the trigger at which the coordinator publishes `checkpoint.switch_to_unaligned` (None: never)."""


class PolicyRule:
    policy: ClassVar[BarrierPolicy]
    takes_alignment_timeout: ClassVar[bool] = False
    """Whether `checkpoint.alignment_timeout` means anything for this policy (config validation refuses it if not)."""
    takes_inflight_budget: ClassVar[bool] = True
    """Whether its checkpoints can persist in-flight data, so an in-flight budget limits them."""

    def plan(self, cfg: CheckpointConfig) -> BarrierPlan:
        return BarrierPlan(self.policy)


class Aligned(PolicyRule):
    """Subtasks block each channel on its barrier until all arrived; nothing to announce."""

    policy = BarrierPolicy.aligned
    takes_inflight_budget = False


class Unaligned(PolicyRule):
    """Barriers overtake buffers from the first one on; nothing to announce."""

    policy = BarrierPolicy.unaligned


class AlignedThenUnaligned(PolicyRule):
    """Aligned until the alignment timeout, then unaligned: the timeout travels with the trigger, and the
    coordinator announces the switch when the checkpoint is still pending then. With a zero timeout the barrier
    itself says 'unaligned from the start' and no switch is announced."""

    policy = BarrierPolicy.aligned_then_unaligned
    takes_alignment_timeout = True

    def plan(self, cfg: CheckpointConfig) -> BarrierPlan:
        timeout = cfg.alignment_timeout if cfg.alignment_timeout is not None else 0
        return BarrierPlan(self.policy, alignment_timeout=timeout, switch_after=timeout or None)


POLICY_RULES: dict[BarrierPolicy, PolicyRule] = {
    rule.policy: rule for rule in (Aligned(), Unaligned(), AlignedThenUnaligned())
}


def barrier_plan(policy: BarrierPolicy, cfg: CheckpointConfig) -> BarrierPlan:
    return POLICY_RULES[policy].plan(cfg)


def inflight_budget(policy: BarrierPolicy, cfg: CheckpointConfig, num_subtasks: int) -> int | None:
    """The in-flight bytes each subtask may persist for one checkpoint of ``policy``: the smaller of the per-subtask
    budget and the job's shared equally by its subtasks (None: no limit, or a policy that persists none)."""
    if not POLICY_RULES[policy].takes_inflight_budget:
        return None
    budgets = [b for b in (cfg.max_inflight_bytes_per_subtask,) if b is not None]
    if cfg.max_inflight_bytes is not None:
        budgets.append(cfg.max_inflight_bytes // max(1, num_subtasks))
    return min(budgets, default=None)
