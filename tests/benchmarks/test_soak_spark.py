"""The randomized rescale soak on Spark (``benchmarks.soak_spark``): its check catches a lost, a repeated and a
reordered record; its cases vary as claimed; one case runs on Spark, a rescale of source and keyed stage with a kill
after it."""

from __future__ import annotations

import pytest

from benchmarks.soak_spark import Case, check, run_case


def counted(seqs: list[int], keys: int = 3) -> list[tuple[int, int, int]]:
    """The rows a keyed count emits for ``seqs`` in that order (key: seq % keys)."""
    n: dict[int, int] = {}
    rows = []
    for s in seqs:
        k = s % keys
        n[k] = n.get(k, 0) + 1
        rows.append((k, s, n[k]))
    return rows


def test_the_check_passes_an_exact_count_and_catches_each_kind_of_error():
    good = counted(list(range(30)))
    assert check(good, 30, 2) == (0, 0, 0)
    assert check(good[:-1], 30, 2)[0] == 1  # the last record lost
    assert check(good + [good[4]], 30, 2)[1] == 1  # a record repeated
    swapped = counted([0, 1, 8, 3, 4, 5, 6, 7, 2, 9, 10, 11])  # key 2, split 0: 8 counted before 2
    assert check(swapped, 12, 2)[2] >= 1
    recounted = [(k, s, n + (1 if s == 10 else 0)) for k, s, n in counted(list(range(12)))]
    assert check(recounted, 12, 1)[2] == 1  # key 1's counts skip a number


def test_cases_are_drawn_from_their_seed_always_rescale_the_keyed_stage_and_vary():
    cases = [Case.draw(s) for s in range(200)]
    assert Case.draw(7) == Case.draw(7)
    assert all(c.new_keyed != c.keyed and 1 <= c.new_keyed <= 4 for c in cases)
    assert any(c.new_sources != c.sources for c in cases) and any(c.kill for c in cases)
    assert {c.checkpoints for c in cases} == {1, 2, 3}
    assert any(c.new_keyed > c.keyed for c in cases) and any(c.new_keyed < c.keyed for c in cases)


@pytest.mark.spark
@pytest.mark.slow
def test_a_case_rescaling_source_and_keyed_stage_with_a_kill_after_it_counts_every_record_once(spark, coordinator,
                                                                                                tmp_path):
    case = Case.draw(8)
    assert case.kill and case.new_sources != case.sources and case.new_keyed != case.keyed
    outcome = run_case(spark, coordinator.url, case, tmp_path)
    assert outcome.error is None, outcome.error
    assert (outcome.lost, outcome.duplicated, outcome.reordered) == (0, 0, 0)
    assert outcome.records == case.count and outcome.restored_checkpoint is not None
    assert outcome.kills == 1, "the kill did not land"
