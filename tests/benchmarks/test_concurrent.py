"""Scenario 13 (concurrent unaligned checkpoints): its arithmetic, its report and its wiring into ``overtake bench``,
with made-up runs. No timing is asserted."""

from __future__ import annotations

import json

from benchmarks import cli, concurrent, options
from benchmarks.concurrent import ConcurrentRun, summarize
from benchmarks.flip76 import RunStats


def _run(k: int, completed: int, aborted: int, durations: list[int]) -> ConcurrentRun:
    stats = RunStats("concurrent", "x", "unaligned", 1, 30.0, completed=completed, aborted=aborted,
                     durations_ms=durations)
    return ConcurrentRun(k, stats)


def test_the_summary_counts_completed_checkpoints_per_minute_of_the_run_and_the_duration_percentiles():
    x = summarize(completed=45, aborted=3, durations_ms=[100, 200, 300, 400, 1000], seconds=30.0)
    assert x["per_minute"] == 90.0
    assert (x["duration_p50"], x["duration_p90"]) == (300.0, 1000.0)
    assert (x["completed"], x["aborted"]) == (45, 3)


def test_a_run_with_nothing_completed_has_no_percentiles():
    x = summarize(completed=0, aborted=0, durations_ms=[], seconds=12.0)
    assert (x["per_minute"], x["duration_p50"]) == (0.0, None)


def test_the_runs_are_max_concurrent_1_then_2_every_20_ms_at_depth_2():
    s = concurrent.Settings.quick_settings()
    assert (s.concurrency, s.interval_ms, s.depth, s.quick) == ((1, 2), 20, 2, True)


def test_the_report_has_one_row_per_max_concurrent_and_its_json_the_summary(tmp_path):
    s = concurrent.Settings.quick_settings()
    runs = [_run(1, 20, 0, [900, 1000]), _run(2, 40, 2, [800, 900])]
    text = concurrent.write(runs, s, tmp_path, "overtake bench concurrent --quick")
    assert "| 1 | 20 | 40.0 | 900 ms |" in text and "| 2 | 40 | 80.0 | 800 ms |" in text
    data = json.loads((tmp_path / "concurrent.json").read_text())
    assert [(r["max_concurrent"], r["per_minute"]) for r in data["runs"]] == [(1, 40.0), (2, 80.0)]


def test_concurrent_is_scenario_13_of_overtake_bench():
    assert cli.bench_args(["13"]).chosen == ["concurrent"]
    s = options.concurrent_settings_from(cli.bench_args(["concurrent"], quick=True, seconds=5))
    assert (s.seconds, s.quick) == (5, True)
