"""The trigger-spacing benchmark against a real coordinator process (SQLite): periodic checkpoints acknowledged as
they come, never triggered sooner than their interval after the previous one, and the scenario reachable from
``overtake bench``."""

from __future__ import annotations

from benchmarks import cli
from benchmarks.trigger_spacing import IntervalRun, Settings, markdown, run


def test_periodic_checkpoints_are_measured_and_never_come_sooner_than_their_interval():
    s = Settings(intervals=(20,), subtasks=3, seconds=2.0, max_concurrent=(1, 2))
    runs = run(s)
    assert [(r.interval_ms, r.max_concurrent) for r in runs] == [(20, 1), (20, 2)]
    for r in runs:
        assert r.triggers >= 3 and r.completed >= 2, r.as_dict()
        assert len(r.spacing_ms) == r.triggers - 1
        assert min(r.spacing_ms) >= 20, r.spacing_ms  # the interval is a floor: one interval after the last trigger
        assert all(d >= 0 for d in r.duration_ms) and all(g >= 0 for g in r.gap_ms)
    text = markdown(s, runs, "overtake bench triggers", "2 cores")
    assert "| 20 ms | 1 |" in text and "| 20 ms | 2 |" in text


def test_the_report_shows_a_spacing_that_drifts_as_the_run_goes_on():
    """A cost that grows with the checkpoints behind shows as a last fifth slower than the first."""
    drifting = IntervalRun(10, spacing_ms=[11] * 20 + list(range(12, 42)) + [29] * 10)
    steady = IntervalRun(10, spacing_ms=[11, 12] * 30)
    assert drifting.fifths() == (11.0, 29.0)
    first, last = steady.fifths()
    assert first is not None and first == last
    assert IntervalRun(10, spacing_ms=[11, 12]).fifths() == (None, None)  # too few to say
    assert drifting.as_dict()["spacing_ms_p50_last_fifth"] == 29.0
    text = markdown(Settings(intervals=(10,), max_concurrent=(1,)), [drifting], "overtake bench triggers", "")
    assert "| 11 ms → 29 ms |" in text


def test_the_scenario_is_reachable_from_overtake_bench():
    assert cli.bench_args(["16"]).chosen == cli.bench_args(["triggers"]).chosen == ["triggers"]
    assert "triggers" in cli.bench_args([]).chosen
