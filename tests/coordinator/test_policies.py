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


def test_last_barrier_announces_nothing_and_takes_no_inflight_budget():
    plan = barrier_plan(BarrierPolicy.unaligned_last_barrier, CheckpointConfig(policy="unaligned_last_barrier"))
    assert (plan.policy, plan.alignment_timeout, plan.switch_after) == (BarrierPolicy.unaligned_last_barrier, None, None)
    cfg = CheckpointConfig(policy="unaligned_last_barrier", max_inflight_bytes_per_subtask=1000)
    assert inflight_budget(BarrierPolicy.unaligned_last_barrier, cfg, 4) is None


def test_aligned_then_unaligned_carries_its_timeout_and_switches_after_it():
    plan = barrier_plan(BarrierPolicy.aligned_then_unaligned, CheckpointConfig(alignment_timeout=200))
    assert (plan.alignment_timeout, plan.switch_after) == (200, 200)


def test_aligned_then_unaligned_with_no_timeout_is_unaligned_from_the_barrier_on_without_a_switch_event():
    plan = barrier_plan(BarrierPolicy.aligned_then_unaligned, CheckpointConfig())
    assert (plan.alignment_timeout, plan.switch_after) == (0, None)


# --------------------------------------------------------------------------- the adaptive policy


def _decide(history=(), backpressure=None, budget=1000):
    from app.domain.adaptive import Observations, decide

    return decide(Observations(history=tuple(history), backpressure=backpressure), budget)


def test_adaptive_goes_unaligned_under_high_backpressure_whatever_the_history():
    from app.domain.adaptive import Seen

    d = _decide([Seen(id=7, alignment_duration=3)], backpressure=0.9)
    assert d.chosen == BarrierPolicy.unaligned and "backpressure 0.90" in d.reason
    assert (d.requested, d.backpressure, d.based_on, d.budget) == (BarrierPolicy.adaptive, 0.9, 7, 1000)


def test_adaptive_starts_aligned_with_the_budget_and_reacts_to_failure_switch_and_slow_alignment():
    from app.domain.adaptive import Seen

    assert _decide().chosen == BarrierPolicy.aligned_then_unaligned
    assert _decide([Seen(id=3, failed="expired")]).chosen == BarrierPolicy.unaligned
    switched = _decide([Seen(id=4, unaligned=True, switched=True, persisted_data=10)])
    assert switched.chosen == BarrierPolicy.unaligned and "1000 ms budget" in switched.reason
    assert _decide([Seen(id=5, alignment_duration=600)]).chosen == BarrierPolicy.unaligned
    quick = _decide([Seen(id=6, alignment_duration=20)], backpressure=0.3)
    assert quick.chosen == BarrierPolicy.aligned_then_unaligned and "20 ms" in quick.reason


def test_adaptive_leaves_unaligned_only_when_channels_emptied_and_backpressure_dropped():
    from app.domain.adaptive import CALM_BYTES_PER_SUBTASK, Seen

    full = Seen(id=8, unaligned=True, persisted_data=4 * 10 * CALM_BYTES_PER_SUBTASK, num_subtasks=4)
    calm = Seen(id=9, unaligned=True, persisted_data=4 * CALM_BYTES_PER_SUBTASK // 2, num_subtasks=4)
    assert _decide([full]).chosen == BarrierPolicy.unaligned
    assert _decide([calm], backpressure=0.3).chosen == BarrierPolicy.unaligned  # between the two thresholds
    back = _decide([calm], backpressure=0.1)
    assert back.chosen == BarrierPolicy.aligned_then_unaligned and "nearly empty" in back.reason


def test_adaptive_plans_carry_the_chosen_policy_and_the_budget_as_alignment_timeout():
    from app.domain.adaptive import Observations

    aligned = barrier_plan(BarrierPolicy.adaptive, CheckpointConfig(policy="adaptive", alignment_timeout=300))
    assert (aligned.policy, aligned.alignment_timeout, aligned.switch_after) == (
        BarrierPolicy.aligned_then_unaligned, 300, 300)
    assert aligned.decision is not None and aligned.decision.budget == 300
    hot = barrier_plan(BarrierPolicy.adaptive, CheckpointConfig(policy="adaptive"), Observations(backpressure=1.0))
    assert (hot.policy, hot.alignment_timeout, hot.switch_after) == (BarrierPolicy.unaligned, None, None)
    # no alignment_timeout: the default budget, never more than half the checkpoint timeout
    short = barrier_plan(BarrierPolicy.adaptive, CheckpointConfig(policy="adaptive", timeout=400))
    assert short.alignment_timeout == 200


def test_the_inflight_budget_of_a_subtask_is_the_smaller_of_its_own_and_its_share_of_the_jobs():
    cfg = CheckpointConfig(policy="unaligned", max_inflight_bytes_per_subtask=1000, max_inflight_bytes=6000)
    assert inflight_budget(BarrierPolicy.unaligned, cfg, 4) == 1000
    assert inflight_budget(BarrierPolicy.unaligned, cfg, 10) == 600
    assert inflight_budget(BarrierPolicy.aligned_then_unaligned, CheckpointConfig(max_inflight_bytes=700), 2) == 350


def test_no_budget_configured_or_an_aligned_checkpoint_has_no_inflight_budget():
    assert inflight_budget(BarrierPolicy.unaligned, CheckpointConfig(policy="unaligned"), 4) is None
    cfg = CheckpointConfig(policy="unaligned", max_inflight_bytes_per_subtask=1000)
    assert inflight_budget(BarrierPolicy.aligned, cfg, 4) is None  # a savepoint, or a trigger asking aligned
