"""The adaptive policy through the coordinator: each checkpoint records what it chose and why, from the job's
finished checkpoints and the live backpressure its subtasks report; the barriers carry the chosen policy."""

from __future__ import annotations

import time

from contract.models import BarrierPolicy


async def _ack_all(api, job, cp, **metrics):
    for v in job["graph"]["vertices"]:
        for i in range(v["parallelism"]):
            r = await api.ack(job["id"], cp, v["id"], i, metrics=metrics)
            assert r.status_code == 200, r.text


async def _report(api, job, backpressure):
    for v in job["graph"]["vertices"]:
        for i in range(v["parallelism"]):
            r = await api.client.post(
                f"/api/v1/jobs/{job['id']}/attempts/1/subtasks/{v['id']}/{i}/metrics",
                json={"timestamp": int(time.time() * 1000), "metrics": {"backpressure": backpressure}},
            )
            assert r.status_code == 204, r.text


async def test_adaptive_checkpoints_follow_backpressure_as_it_comes_and_goes_and_say_why(api):
    job = await api.job(policy="adaptive", alignment_timeout=400, max_concurrent=1)
    first = (await api.trigger(job["id"])).json()
    assert first["policy"] == "aligned_then_unaligned" and first["alignment_timeout"] == 400
    assert first["decision"]["requested"] == "adaptive" and "no finished checkpoint" in first["decision"]["reason"]
    await _ack_all(api, job, first["id"], alignment_duration=5)

    # backpressure arrives and neither choice has been tried under pressure: unaligned first, and the trigger says so
    await _report(api, job, 0.95)
    hot = (await api.trigger(job["id"])).json()
    assert hot["policy"] == "unaligned" and hot["alignment_timeout"] is None
    assert hot["decision"]["backpressure"] == 0.95 and hot["decision"]["based_on"] == first["id"]
    assert "not tried under pressure" in hot["decision"]["reason"]
    triggered = [e for e in await api.events(job["id"]) if e["type"] == "checkpoint.triggered"]
    assert triggered[-1]["data"]["policy"] == "unaligned"
    await _ack_all(api, job, hot["id"], unaligned=True, persisted_data=4 << 20)

    # backpressure eases but the last checkpoint still persisted megabytes: still under pressure, and the aligned
    # choice has no checkpoint under pressure to judge it by, so it is tried
    await _report(api, job, 0.1)
    still = (await api.trigger(job["id"])).json()
    assert still["policy"] == "aligned_then_unaligned" and still["alignment_timeout"] == 400
    assert "still full" in still["decision"]["reason"] and "try it" in still["decision"]["reason"]
    await _ack_all(api, job, still["id"], alignment_duration=5)

    # it aligned quickly: align again, as a calm guess with a budget learned from the alignments (5 ms, twice that,
    # at least MIN_BUDGET_MS), not the whole 400 ms; the trial under pressure above kept the whole budget
    calm = (await api.trigger(job["id"])).json()
    assert calm["policy"] == "aligned_then_unaligned" and "well within" in calm["decision"]["reason"]
    assert calm["alignment_timeout"] == 10 and calm["decision"]["budget"] == 10
    assert "switching after 10 ms" in calm["decision"]["reason"]
    listed = (await api.client.get(f"/api/v1/jobs/{job['id']}/checkpoints/{calm['id']}")).json()
    assert listed["decision"] == calm["decision"]


async def test_a_failed_adaptive_checkpoint_makes_the_next_one_unaligned(api):
    job = await api.job(policy="adaptive", tolerable_failures=5)
    await api.trigger(job["id"])
    r = await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/1/declines",
        json={"attempt": 1, "vertex": "agg", "subtask_index": 0, "reason": "alignment ran out"},
    )
    assert r.status_code == 200
    nxt = (await api.trigger(job["id"])).json()
    assert nxt["policy"] == "unaligned" and "checkpoint 1 failed (declined)" in nxt["decision"]["reason"]


async def test_a_fixed_policy_records_no_decision_and_a_trigger_may_ask_for_adaptive_once(api):
    job = await api.job(policy="aligned")
    fixed = (await api.trigger(job["id"])).json()
    assert fixed["policy"] == "aligned" and fixed["decision"] is None
    await _ack_all(api, job, fixed["id"])
    once = (await api.trigger(job["id"], policy="adaptive")).json()
    assert once["decision"]["requested"] == "adaptive" and once["policy"] == "aligned_then_unaligned"


async def test_alignment_timeout_is_accepted_for_adaptive_and_savepoints_stay_aligned(api):
    job = await api.job(policy="adaptive", alignment_timeout=100)
    sp = (await api.client.post(f"/api/v1/jobs/{job['id']}/savepoints", json={})).json()
    assert sp["policy"] == "aligned" and sp["decision"] is None


# --------------------------------------------------------------------------- choosing from what each choice achieved

def _under_pressure(history, backpressure=0.9, budget=200):
    from app.domain.adaptive import Observations, decide

    return decide(Observations(history=tuple(history), backpressure=backpressure), budget)


def _aligned(id, duration):
    """An aligned-then-unaligned checkpoint that ran out of its budget and switched."""
    from app.domain.adaptive import Seen

    return Seen(id=id, unaligned=True, switched=True, alignment_duration=200, persisted_data=1 << 20,
                policy=BarrierPolicy.aligned_then_unaligned, duration=duration)


def _unaligned(id, duration):
    """An unaligned checkpoint that persisted full channels."""
    from app.domain.adaptive import Seen

    return Seen(id=id, unaligned=True, persisted_data=2 << 20, policy=BarrierPolicy.unaligned, duration=duration)


def test_under_pressure_the_choice_whose_recent_checkpoints_were_faster_is_chosen():
    slow_align = [_unaligned(10, 90), _aligned(9, 400), _unaligned(8, 100), _aligned(7, 420), _unaligned(6, 110)]
    d = _under_pressure(slow_align)
    assert d.chosen == BarrierPolicy.unaligned
    slow_unaligned = [_unaligned(10, 450), _aligned(9, 250), _unaligned(8, 420), _aligned(7, 240), _unaligned(6, 400)]
    assert _under_pressure(slow_unaligned).chosen == BarrierPolicy.aligned_then_unaligned


def test_within_the_margin_the_choice_that_persists_less_is_chosen():
    from app.domain.adaptive import MARGIN

    # unaligned faster, but by less than the margin: aligned-then-unaligned persists less
    close = [_unaligned(10, int(250 * (1 - MARGIN / 2))), _aligned(9, 250)]
    assert _under_pressure(close).chosen == BarrierPolicy.aligned_then_unaligned
    equal = [_unaligned(10, 250), _aligned(9, 250)]
    assert _under_pressure(equal).chosen == BarrierPolicy.aligned_then_unaligned


def test_a_slow_alignment_or_full_channels_count_as_pressure_without_live_backpressure():
    # no live metrics on this replica: the checkpoints alone say the job is under pressure, and the figures decide
    history = [_aligned(10, 400), _unaligned(9, 100)]
    assert _under_pressure(history, backpressure=None).chosen == BarrierPolicy.unaligned
    history = [_unaligned(10, 400), _aligned(9, 200)]
    assert _under_pressure(history, backpressure=None).chosen == BarrierPolicy.aligned_then_unaligned


def test_a_choice_not_tried_under_pressure_in_the_recent_checkpoints_is_tried_again():
    from app.domain.adaptive import HISTORY

    # aligned was slower, but that was long ago; everything since was unaligned: once its checkpoint leaves the
    # window aligned is tried again
    recent = [_unaligned(100 - i, 300) for i in range(HISTORY - 1)] + [_aligned(50, 400)]
    compared = _under_pressure(recent)
    assert compared.chosen == BarrierPolicy.unaligned and "median" in compared.reason
    stale = [_unaligned(100 - i, 300) for i in range(HISTORY)] + [_aligned(50, 400)]
    tried = _under_pressure(stale)
    assert tried.chosen == BarrierPolicy.aligned_then_unaligned
    assert f"aligned_then_unaligned not tried under pressure in the last {HISTORY} checkpoints" in tried.reason
    # and the other way round
    stale = [_aligned(100 - i, 300) for i in range(HISTORY)] + [_unaligned(50, 100)]
    assert _under_pressure(stale).chosen == BarrierPolicy.unaligned


def test_calm_checkpoints_are_no_evidence_of_what_a_choice_achieves_under_pressure():
    from app.domain.adaptive import Seen

    # quick alignments in calm phases (26 ms) must not make aligned look fast under pressure
    calm = [Seen(id=10 - i, alignment_duration=5, policy=BarrierPolicy.aligned_then_unaligned, duration=26)
            for i in range(4)]
    d = _under_pressure(calm + [_unaligned(5, 300)])
    assert d.chosen == BarrierPolicy.aligned_then_unaligned and "try it" in d.reason


def test_the_reason_names_the_figures_compared():
    history = [_unaligned(10, 90), _aligned(9, 400), _unaligned(8, 110), _aligned(7, 420), _unaligned(6, 100)]
    d = _under_pressure(history)
    assert "backpressure 0.90" in d.reason
    assert "unaligned took 100 ms (median of 3)" in d.reason and "aligned then unaligned 410 ms (median of 2)" in d.reason
    assert d.based_on == 10 and d.budget == 200


def test_the_choice_is_the_same_for_the_same_inputs():
    history = [_unaligned(10, 240), _aligned(9, 250), _unaligned(8, 260), _aligned(7, 230)]
    assert len({_under_pressure(history).model_dump_json() for _ in range(5)}) == 1


def test_an_unaligned_checkpoint_that_persisted_little_in_flight_data_still_counts():
    from app.domain.adaptive import CALM_BYTES_PER_SUBTASK, Seen

    # credit-bounded channels: a busy phase's unaligned checkpoint may persist little per subtask; it is still a
    # sample of what unaligned achieves, not a reason to try unaligned again
    light = Seen(id=10, unaligned=True, persisted_data=CALM_BYTES_PER_SUBTASK, num_subtasks=4,
                 policy=BarrierPolicy.unaligned, duration=30)
    d = _under_pressure([light, _aligned(9, 240)])
    assert d.chosen == BarrierPolicy.unaligned and "unaligned took 30 ms (median of 1)" in d.reason


# --------------------------------------------------------------------------- the learned budget of a calm guess

def _clean(id, start_delay, alignment):
    """An aligned-then-unaligned checkpoint that aligned without switching."""
    from app.domain.adaptive import Seen

    return Seen(id=id, alignment_duration=alignment, start_delay=start_delay, policy=BarrierPolicy.aligned_then_unaligned, duration=start_delay + alignment + 12)


def test_a_calm_guess_switches_after_twice_the_longest_recent_trigger_to_aligned_time():
    from app.domain.adaptive import BUDGET_HEADROOM, MIN_BUDGET_MS, SAMPLE

    history = [_clean(10, 6, 3), _clean(9, 9, 8), _clean(8, 4, 1)]
    d = _under_pressure(history, backpressure=0.1)
    assert d.chosen == BarrierPolicy.aligned_then_unaligned
    assert d.budget == BUDGET_HEADROOM * 17 and "at most 17 ms from the trigger" in d.reason
    # never below the floor, never above the job's budget
    assert _under_pressure([_clean(10, 1, 1)], backpressure=0.1).budget == MIN_BUDGET_MS
    assert _under_pressure([_clean(10, 30, 90)], backpressure=0.1).budget == 200
    # only the newest SAMPLE clean alignments count: a slow one long ago no longer widens it
    old_slow = [_clean(20 - i, 3, 2) for i in range(SAMPLE)] + [_clean(5, 80, 60)]
    assert _under_pressure(old_slow, backpressure=0.1).budget == MIN_BUDGET_MS


def test_switched_or_unaligned_checkpoints_teach_no_budget_and_without_a_clean_alignment_the_budget_is_whole():
    from app.domain.adaptive import CALM_BYTES_PER_SUBTASK, Seen

    light = Seen(id=10, unaligned=True, persisted_data=CALM_BYTES_PER_SUBTASK // 2, policy=BarrierPolicy.unaligned,
                 duration=30)
    # calm, nothing ever aligned cleanly: the whole budget; with backpressure between the two thresholds it is no
    # calm guess but the pressure rule's trial of aligning (the whole budget too)
    assert _under_pressure([light], backpressure=0.1).budget == 200
    between = _under_pressure([light], backpressure=0.3)
    assert "nearly empty" not in between.reason and "try it" in between.reason and between.budget == 200
    # a clean alignment in the window does not widen the calm rule: between the two thresholds it is still the
    # pressure rule's trial (guessing calm there made a busy phase's first checkpoints switch more often)
    d = _under_pressure([light, _clean(9, 5, 2)], backpressure=0.3)
    assert "try it" in d.reason and d.budget == 200
    assert _under_pressure([light, _clean(9, 5, 2)], backpressure=0.1).budget == 14
    # hot: no guess, the figures decide and an aligned trial gets the whole budget
    hot = _under_pressure([light, _clean(9, 5, 2)], backpressure=0.9)
    assert hot.chosen == BarrierPolicy.aligned_then_unaligned and "try it" in hot.reason and hot.budget == 200


def test_a_calm_guess_that_switched_after_its_learned_budget_counts_as_aligning_under_pressure():
    from app.domain.adaptive import Seen

    def guess(id, duration):
        return Seen(id=id, unaligned=True, switched=True, alignment_duration=14, persisted_data=1 << 20, policy=BarrierPolicy.aligned_then_unaligned, duration=duration)

    # the guess switched after 14 ms and took 44 ms: aligning does not look faster than unaligned's 30 ms, and no
    # trial with the whole budget is needed
    d = _under_pressure([guess(10, 44), _unaligned(9, 30)])
    assert d.chosen == BarrierPolicy.unaligned and "aligned then unaligned 44 ms" in d.reason
    # slow unaligned checkpoints (250 ms): the guess (264 ms) is within the margin, aligning is chosen, and with the
    # whole budget, so that the next sample shows what aligning achieves
    slow = _under_pressure([guess(10, 264), _unaligned(9, 250)])
    assert slow.chosen == BarrierPolicy.aligned_then_unaligned and slow.budget == 200
