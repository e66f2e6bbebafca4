"""Scenario 12 (in-flight budget): its arithmetic, its report and its wiring into ``overtake bench``, with made-up
runs. No timing is asserted."""

from __future__ import annotations

import json

from benchmarks import budget, cli, options
from benchmarks.budget import KIB, BudgetRun, SubtaskAck, summarize
from benchmarks.flip76 import RunStats


def _run(depth: int, b: int | None, persisted: list[int], acks: list[list[SubtaskAck]]) -> BudgetRun:
    stats = RunStats("budget", "x", "unaligned", depth, 10, completed=len(persisted),
                     durations_ms=[100, 200, 300, 400, 1000], persisted_bytes=persisted)
    return BudgetRun(depth, b, stats, acks)


def test_the_summary_counts_fallbacks_and_how_far_one_subtask_went_past_its_budget():
    acks = [[SubtaskAck(70 * KIB, True), SubtaskAck(0, False)], [SubtaskAck(10 * KIB, True), SubtaskAck(0, False)]]
    x = summarize([100, 200, 300, 400, 1000], [70 * KIB, 10 * KIB], acks, 64 * KIB)
    assert (x["duration_p50"], x["duration_p90"]) == (300.0, 1000.0)
    assert (x["persisted_avg"], x["persisted_max"]) == (40 * KIB, 70 * KIB)
    assert (x["subtask_max"], x["subtask_over_budget"]) == (70 * KIB, 6 * KIB)
    assert (x["fell_back"], x["acks"]) == (2, 4)


def test_within_the_budget_nothing_is_past_it_and_without_one_nothing_is_compared():
    acks = [[SubtaskAck(10, True)]]
    assert summarize([5], [10], acks, 64)["subtask_over_budget"] == 0
    assert summarize([5], [10], acks, None)["subtask_over_budget"] is None
    assert summarize([], [], [], 64)["duration_p50"] is None


def test_the_runs_are_every_depth_with_no_budget_first_then_64_and_256_kib():
    s = budget.Settings.quick_settings()
    assert s.runs() == [(1, None), (1, 64 * KIB), (1, 256 * KIB), (2, None), (2, 64 * KIB), (2, 256 * KIB)]


def test_the_report_has_one_row_per_run_and_its_json_the_summary(tmp_path):
    s = budget.Settings.quick_settings()
    runs = [_run(1, None, [300 * KIB], [[SubtaskAck(300 * KIB, True)]]),
            _run(1, 64 * KIB, [0], [[SubtaskAck(0, False)]])]
    text = budget.write(runs, s, tmp_path, "overtake bench budget --quick")
    assert "| 1 | none |" in text and "| 1 | 64.0 KiB |" in text and "1 of 1 |" in text
    data = json.loads((tmp_path / "budget.json").read_text())
    assert [r["budget"] for r in data["runs"]] == [None, 64 * KIB]


def test_budget_is_scenario_12_of_overtake_bench():
    assert cli.bench_args(["12"]).chosen == ["budget"]
    assert cli.bench_args(["budget"], quick=True, depths="1", seconds=5).chosen == ["budget"]
    s = options.budget_settings_from(cli.bench_args(["budget"], quick=True, depths="1", seconds=5))
    assert (s.depths, s.seconds, s.quick) == ((1,), 5, True)


def test_the_backpressured_run_hands_its_checkpoint_fields_to_the_run_as_such(monkeypatch):
    from benchmarks.flip76 import Runner, Settings

    seen = {}
    monkeypatch.setattr(Runner, "run", lambda self, *a, **kw: seen.update(args=a, kwargs=kw))
    Runner(None, "http://x", Settings()).backpressured("unaligned", 1, checkpoint={"max_inflight_bytes_per_subtask": 1})
    assert seen["kwargs"]["checkpoint"] == {"max_inflight_bytes_per_subtask": 1}
    assert all(not isinstance(a, dict) for a in seen["args"])  # not taken for another parameter by position
