"""Each barrier policy's coordinator side is one rule: every policy has one, and what it plans for a checkpoint."""

from __future__ import annotations

from app.domain.policies import POLICY_RULES, barrier_plan, inflight_budget
from contract.models import BarrierPolicy, CheckpointConfig


def test_every_barrier_policy_has_exactly_one_coordinator_rule():
    assert set(POLICY_RULES) == set(BarrierPolicy)


def test_aligned_and_unaligned_announce_nothing():
    for policy in (BarrierPolicy.aligned, BarrierPolicy.unaligned):
        plan = barrier_plan(policy, CheckpointConfig())
        assert (plan.policy, plan.alignment_timeout, plan.switch_after) == (policy, None, None)


def test_aligned_then_unaligned_carries_its_timeout_and_switches_after_it():
    plan = barrier_plan(BarrierPolicy.aligned_then_unaligned, CheckpointConfig(alignment_timeout=200))
    assert (plan.alignment_timeout, plan.switch_after) == (200, 200)


def test_aligned_then_unaligned_with_no_timeout_is_unaligned_from_the_barrier_on_without_a_switch_event():
    plan = barrier_plan(BarrierPolicy.aligned_then_unaligned, CheckpointConfig())
    assert (plan.alignment_timeout, plan.switch_after) == (0, None)


def test_the_inflight_budget_of_a_subtask_is_the_smaller_of_its_own_and_its_share_of_the_jobs():
    cfg = CheckpointConfig(policy="unaligned", max_inflight_bytes_per_subtask=1000, max_inflight_bytes=6000)
    assert inflight_budget(BarrierPolicy.unaligned, cfg, 4) == 1000
    assert inflight_budget(BarrierPolicy.unaligned, cfg, 10) == 600
    assert inflight_budget(BarrierPolicy.aligned_then_unaligned, CheckpointConfig(max_inflight_bytes=700), 2) == 350


def test_no_budget_configured_or_an_aligned_checkpoint_has_no_inflight_budget():
    assert inflight_budget(BarrierPolicy.unaligned, CheckpointConfig(policy="unaligned"), 4) is None
    cfg = CheckpointConfig(policy="unaligned", max_inflight_bytes_per_subtask=1000)
    assert inflight_budget(BarrierPolicy.aligned, cfg, 4) is None  # a savepoint, or a trigger asking aligned
