"""Scenario 18's arithmetic without Spark: which attempt, stage and checkpoint follow each kill, and the report."""

from __future__ import annotations

import os
from types import SimpleNamespace

from benchmarks import cli
from benchmarks.kill_restart import (
    Kill,
    KrReport,
    attribute,
    compare_markdown,
    markdown,
    pct,
    stages_up,
    summary,
)


def cp(attempt, trigger, duration, status="COMPLETED"):
    return SimpleNamespace(attempt=attempt, trigger_timestamp=trigger, end_to_end_duration=duration, status=status)


def test_each_kill_is_followed_by_the_next_attempt_the_next_stage_up_and_that_attempts_first_checkpoint():
    kills = [Kill(10_000, "000001"), Kill(20_000, "000002")]
    attempts = [SimpleNamespace(attempt=a, started_at=t) for a, t in ((1, 0), (2, 10_400), (3, 21_000))]
    checkpoints = [cp(1, 9_000, 100), cp(2, 11_000, 300), cp(2, 12_000, 50), cp(3, 22_000, 500, "FAILED"),
                   cp(3, 23_000, 200)]
    up = {"000001": 5.0, "000002": 12.5, "000003": 23.0}  # epoch seconds the last task of each stage announced
    attribute(kills, attempts, checkpoints, up, {2: {"detect_ms": 300, "relaunch_ms": 1500}})
    first, second = kills
    assert (first.attempt, first.attempt_opened_s, first.running_s, first.first_checkpoint_s) == (2, 0.4, 2.5, 1.3)
    assert first.phases == {"detect_ms": 300, "relaunch_ms": 1500}
    # the failed checkpoint of attempt 3 does not count; its first completed one does
    assert (second.attempt, second.attempt_opened_s, second.running_s, second.first_checkpoint_s) == (3, 1.0, 3.0, 3.2)
    assert second.phases == {}


def test_a_kill_no_attempt_followed_keeps_its_times_unknown():
    k = Kill(50_000, "000004")
    attribute([k], [SimpleNamespace(attempt=1, started_at=0)], [], {}, {})
    assert (k.attempt, k.attempt_opened_s, k.running_s, k.first_checkpoint_s) == (None, None, None, None)


def test_a_stage_is_up_once_all_its_tasks_announced_and_at_the_last_ones_time(tmp_path):
    for name, t in (("000001-0.pid", 100), ("000001-1.pid", 104), ("000002-0.pid", 200)):
        (tmp_path / name).write_text("1")
        os.utime(tmp_path / name, (t, t))
    assert stages_up(tmp_path, 2) == {"000001": 104.0}


def test_the_reports_give_p50_and_p90_and_both_settings_side_by_side():
    assert pct([3.0, 1.0, 2.0, None], 0.5) == 2.0 and pct([], 0.5) is None
    ks = [Kill(0, "0", 0.2, 2.0 + i, 3.0 + i, 2 + i, {"relaunch_ms": 1000 + 100 * i}) for i in range(5)]
    settings = {"delay": 0.0003, "interval": 500, "settle": 4.0, "kills": 5}
    text = markdown(KrReport(settings, ks), "overtake bench kill-restart")
    assert "| kill → every task running | 4.00 s | 6.00 s |" in text
    assert "| relaunch (attempt start → first restored subtask running) | 1.20 s | 1.40 s |" in text
    assert summary(KrReport(settings, ks)).startswith("5 kills: kill → running p50 4.00 s, p90 6.00 s")
    slow = [Kill(0, "0", 0.2, 4.0 + i, 5.0 + i, 2 + i, {}) for i in range(5)]
    both = compare_markdown({"no preload": KrReport(settings, slow), "preload": KrReport(settings, ks)}, "cmd")
    assert "| kill → every task running | 6.00 s | 8.00 s | 4.00 s | 6.00 s |" in both


def test_scenario_18_is_kill_restart():
    assert cli.bench_args(["18"]).chosen == ["kill-restart"]
    assert cli.bench_args(["kill-restart"]).command() == "overtake bench kill-restart"
