"""The randomized rescale soak (``benchmarks/soak.py``): its check catches planted losses, duplicates and
reorderings, a restore plan that drops or repeats state makes a case fail, and a short soak of random cases passes.

The long run is a command: ``overtake bench soak --cases N`` (results in the README and docs/benchmarks.md).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks import soak
from benchmarks.soak import replay_command, run_case
from benchmarks.soak_case import Case, draw, sink_id
from benchmarks.soak_check import check, keys_of


def a_case(branches: list[str], runs: list[dict[str, int]], count: int = 60, keys: int = 3) -> Case:
    case = draw(1)
    case.count, case.keys, case.skew, case.branches, case.parallelisms = count, keys, 0.0, branches, runs
    return case


def clean_output(case: Case, tag_of=lambda seq: 0) -> list[tuple[int, tuple]]:
    """What a correct run writes: each seq once, counted per key in seq order."""
    n: dict = {}
    out = []
    for seq, key in enumerate(keys_of(case)):
        n[key] = n.get(key, 0) + 1
        out.append((tag_of(seq), (key, seq, n[key])))
    return out


P = {"src": 2, "count": 2, "count2": 2, "reb": 2, "bc": 2, "out-forward": 2}


def test_the_check_passes_exactly_once_output_in_key_order():
    case = a_case(["chained", "hash"], [P, {**P, "count": 3}])
    out = clean_output(case)
    v = check(case, {sink_id("chained"): out, sink_id("hash"): [(t, (*r, r[2])) for t, r in out]})
    assert v.ok, v.problems
    assert v.records == 2 * case.count


def test_the_check_counts_a_planted_loss_a_duplicate_and_a_reordering():
    case = a_case(["chained"], [P, {**P, "count": 1}])
    out = clean_output(case)
    lost = check(case, {sink_id("chained"): out[:10] + out[11:]})
    assert (lost.lost, lost.duplicated, lost.reordered) == (1, 0, 0)

    dup = check(case, {sink_id("chained"): out + [out[7]]})
    assert dup.duplicated == 1 and dup.lost == 0

    # a key's record counted again (its state restored twice): the seq is there once, its count twice
    key, seq, n = out[20][1]
    twice = [(t, (k, s, c + 1 if k == key and s > seq else c)) for t, (k, s, c) in out]
    assert check(case, {sink_id("chained"): twice}).duplicated >= 1

    # two records of one key from the same split counted in the wrong order
    splits = case.parallelisms[0]["src"]
    same = [i for i, (_, r) in enumerate(out) if r[0] == out[0][1][0] and r[1] % splits == out[0][1][1] % splits]
    i, j = same[0], same[1]
    swapped = list(out)
    swapped[i] = (0, (out[i][1][0], out[i][1][1], out[j][1][2]))
    swapped[j] = (0, (out[j][1][0], out[j][1][1], out[i][1][2]))
    v = check(case, {sink_id("chained"): swapped})
    assert v.reordered >= 1 and v.lost == 0 and v.duplicated == 0


def test_the_check_sees_a_key_reordered_across_the_second_shuffle():
    case = a_case(["hash"], [P, {**P, "count2": 3}])
    out = [(t, (*r, r[2])) for t, r in clean_output(case)]
    t, r = out[5]
    out[5] = (t, (*r[:3], r[3] + 1))
    assert check(case, {sink_id("hash"): out}).reordered == 1


def test_the_check_of_a_broadcast_edge_wants_every_record_at_every_receiver_that_always_was():
    runs = [{**P, "bc": 2}, {**P, "bc": 3}]
    case = a_case(["broadcast"], runs)
    out = clean_output(case)
    # receivers 0 and 1 existed in both runs: all records; receiver 2 came with the restore: a suffix per key
    keys = keys_of(case)
    suffix = [(2, r) for _, r in out if r[2] > keys.count(r[0]) // 2]
    good = [(0, r) for _, r in out] + [(1, r) for _, r in out] + suffix
    assert check(case, {sink_id("broadcast"): good}).ok
    assert check(case, {sink_id("broadcast"): good[1:]}).lost == 1
    assert check(case, {sink_id("broadcast"): good + [good[3]]}).duplicated == 1
    gap = [x for x in suffix if x[1] != suffix[len(suffix) // 2][1]]
    assert check(case, {sink_id("broadcast"): good[: 2 * case.count] + gap}).lost == 1


def _planted(monkeypatch, change) -> None:
    """Every restore plan of the soak changed by ``change(parts)`` before the subtasks load it."""
    real = soak.coordinator_plan

    def plan(*args, **kwargs):
        restore_plan, parts = real(*args, **kwargs)
        change(parts)
        return restore_plan, parts

    monkeypatch.setattr(soak, "coordinator_plan", plan)


def _chained_case() -> Case:
    case = draw(3)
    case.branches, case.slow, case.kill_after = ["chained"], "count", []
    case.parallelisms = [{**P, "count": 2}, {**P, "count": 3}]
    return case


def test_a_restore_plan_that_loads_state_twice_fails_the_case(monkeypatch):
    def twice(parts):
        for part in parts.values():
            part["operator_state"] = part["operator_state"] * 2

    _planted(monkeypatch, twice)
    r = run_case(_chained_case())
    assert r.error is None, r.error
    assert r.verdict.duplicated > 0 and not r.verdict.ok


def test_a_restore_plan_that_forgets_operator_state_fails_the_case(monkeypatch):
    def forget(parts):
        for part in parts.values():
            part["operator_state"] = []

    _planted(monkeypatch, forget)
    r = run_case(_chained_case())
    assert r.error is None, r.error
    assert r.verdict.lost > 0 and not r.verdict.ok


@pytest.mark.slow
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31 - 1))
def test_a_short_soak_of_random_rescales_loses_duplicates_and_reorders_nothing(seed):
    r = run_case(draw(seed))
    assert r.verdict.ok, (
        f"{r.case.describe()}\n" + "\n".join(r.verdict.problems[:5]) + f"\n{r.error or ''}\nreplay: "
        + replay_command(seed)
    )


def test_a_case_restores_a_checkpoint_only_once_every_subtask_acked_it(monkeypatch):
    # the keyed stage fans out (a chained sink beside a rebalance branch): the sink becomes a vertex of its own
    case = _chained_case()
    case.branches = ["chained", "rebalance"]
    case.parallelisms = [{**P, "count": 2, "reb": 3}, {**P, "count": 3, "reb": 1}]
    seen = []
    real = soak.coordinator_plan

    def plan(new_plan, acks, blobs, checkpoint_id):
        seen.append(set(acks))
        return real(new_plan, acks, blobs, checkpoint_id)

    monkeypatch.setattr(soak, "coordinator_plan", plan)
    r = run_case(case)
    assert r.verdict.ok and r.error is None, (r.verdict.problems, r.error)
    old = soak.build(case, case.parallelisms[0]).plan()
    assert seen == [{(v.id, i) for v in old.vertices for i in range(v.parallelism)}]
    assert ("out-chained", 1) in seen[0]


@pytest.mark.slow
def test_a_second_rescale_restores_the_checkpoint_the_rescaled_run_completed_after_its_replay():
    # checkpoint ids go on after the restored one's: a restored subtask ignores a trigger of an id it restored
    case = _chained_case()
    case.count, case.delay = 4000, 0.001
    case.parallelisms = [{**P, "count": 2}, {**P, "count": 3}, {**P, "count": 1}]
    case.kill_after = [-1.0]
    r = run_case(case)
    assert r.verdict.ok and r.error is None, (r.verdict.problems, r.error)
    assert r.rescales == 2 and r.chained == 1
