"""Smoke tests of the benchmark report machinery: statistics, targets, the markdown and the plots.

No timing is asserted: these only check that a run's results become a complete report.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks import cli
from benchmarks.ackpath import AckPathStats
from benchmarks.disk import DiskStats
from benchmarks.flip76 import RunStats, Settings, checkpoint_stats
from benchmarks.report import markdown, readme_section, write
from benchmarks.results import BenchResults
from benchmarks.targets import targets


def _cp(id, status, e2e=None, reason=None, persisted=0, trigger=0):
    return SimpleNamespace(id=id, status=SimpleNamespace(value=status), end_to_end_duration=e2e,
                           failure_reason=reason, persisted_data=persisted, trigger_timestamp=trigger)


def test_warm_up_is_left_out_and_checkpoints_pending_at_the_end_are_unfinished_not_aborted():
    cps = [_cp(1, "COMPLETED", 9000), _cp(2, "COMPLETED", 40, persisted=10), _cp(3, "ABORTED", reason="declined"),
           _cp(4, "COMPLETED", 60, persisted=30), _cp(5, "ABORTED", reason="job_ended: FINISHED", trigger=1000)]
    s = checkpoint_stats(RunStats("x", "x", "unaligned", 1, seconds=10), cps, ended_ms=3000)
    assert (s.warm_up, s.checkpoints, s.completed, s.aborted, s.unfinished) == (1, 4, 2, 1, 1)
    assert s.durations_ms == [40, 60] and s.p50 == 50 and s.max == 60 and s.persisted_avg == 20
    assert s.unfinished_age_ms == 2000


def test_a_run_where_nothing_completed_gives_a_lower_bound_no_longer_than_the_run():
    cps = [_cp(1, "ABORTED", reason="job_ended: FINISHED", trigger=0)]
    s = checkpoint_stats(RunStats("x", "x", "aligned", 3, seconds=5), cps, ended_ms=60_000)
    assert s.completed == 0 and s.unfinished == 1
    assert s.p50_or_bound == (5000.0, True)


def _results(quick=True) -> BenchResults:
    s = Settings.quick_settings() if quick else Settings()
    r = BenchResults(settings=s, machine={"cores": "2"}, command="overtake bench --quick", started="now")
    for depth in s.depths:
        for pol, d in (("aligned", [5000 * depth, 6000 * depth]), ("unaligned", [30, 40 + depth]),
                       ("aligned_then_unaligned", [150, 160])):
            x = RunStats("backpressure", f"{pol}, depth {depth}", pol, depth, 10, records=15000, throughput=1500,
                         completed=2, durations_ms=d, persisted_bytes=[1 << 20, 2 << 20])
            if pol != "aligned":
                x.breakdown = {"source": {"ack": 20, "start_delay": 5, "sync": 1, "async": 10},
                               f"slow-{depth}": {"ack": 35, "start_delay": 20, "sync": 1, "async": 12}}
            r.backpressure.append(x)
    r.no_checkpoints_backpressure = RunStats("backpressure", "none", None, 1, 10, throughput=1550)
    r.free = [RunStats("free", "none", None, 1, 5, throughput=100_000),
              RunStats("free", "unaligned", "unaligned", 1, 5, throughput=97_000, completed=4)]
    r.ack_path = [AckPathStats(4, 2, 1024, [90.0, 110.0], [12.0, 14.0], [3.0], [5.0])]
    r.disk = DiskStats("disk", 1 << 20, 1 << 20, 32 << 10, [200.0], [150.0], [900.0], [3.0])
    return r


def test_the_report_has_every_section_the_targets_and_the_plots(tmp_path):
    r = _results()
    path = write(r, tmp_path)
    text = path.read_text()
    for section in ("## Machine", "## Settings", "## Targets", "## 1. Checkpoint duration",
                    "## 2. Throughput under backpressure", "## 3. Throughput without backpressure",
                    "## 4. Channel-state write bandwidth", "Where an unaligned checkpoint's time goes",
                    "Floor of the ack path"):
        assert section in text, section
    assert (tmp_path / "checkpoint_duration.png").stat().st_size > 0
    assert (tmp_path / "throughput.png").stat().st_size > 0
    assert (tmp_path / "results.json").exists()
    readme = (tmp_path / "readme-results.md").read_text()
    assert readme.startswith("## Results") and "Command: `overtake bench --quick`" in readme
    status = {t.name: t.status for t in targets(r)}
    assert status["depth 1: unaligned p50 ≤ aligned p50 / 20"] == "met"
    assert status["depth 1: unaligned p50 < 100 ms"] == "met"
    assert status["channel-state writes ≥ 70% of raw disk bandwidth"] == "met"
    assert status["unaligned every second costs ≤ 5% throughput without backpressure"] == "met"


def test_a_missed_target_says_by_how_much():
    r = _results()
    r.disk.channel_state_mib_s = [50.0]
    r.backpressure[1].durations_ms = [250, 250]  # unaligned at depth 1
    t = {x.name: x for x in targets(r)}
    assert t["channel-state writes ≥ 70% of raw disk bandwidth"].status == "missed"
    assert "45 points short" in t["channel-state writes ≥ 70% of raw disk bandwidth"].detail
    assert t["depth 1: unaligned p50 < 100 ms"].status == "missed"
    assert "2.5× the target" in t["depth 1: unaligned p50 < 100 ms"].detail
    assert "❌ missed" in markdown(r)


def test_scenarios_by_name_or_number_and_unknown_ones_refused():
    assert cli.bench_args(["4", "acks"], quick=True).chosen == ["disk", "acks"]
    assert cli.bench_args([]).chosen == list(cli.SCENARIOS)
    with pytest.raises(cli.BenchUsageError, match="unknown scenario 'nope'"):
        cli.bench_args(["nope"])


def test_quick_disk_scenario_writes_a_report(tmp_path, monkeypatch):
    real = Settings.quick_settings
    monkeypatch.setattr(Settings, "quick_settings", classmethod(lambda cls, **o: real(disk_total_mib=2, **o)))
    assert cli.main(cli.bench_args(["disk"], quick=True, out=tmp_path)) == 0
    text = (tmp_path / "report.md").read_text()
    assert "## 4. Channel-state write bandwidth" in text and "## Machine" in text and "quick settings" in text
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".bench-")]


def test_the_readme_section_names_the_bench_jobs_settings_only_when_a_scenario_ran_that_job():
    """A run of scenarios with jobs of their own (kafka, batches) has no parallelism or slow stage of the bench's
    job to state: its readme section said "parallelism 2, a slow stage of 1 ms" for a Kafka run of parallelism 1 and
    2 ms."""
    s = Settings()
    alone = BenchResults(settings=s, machine={"cores": "2"}, command="overtake bench kafka", started="now")
    assert "slow stage" not in readme_section(alone) and "Every comparison is within this one run." in \
        readme_section(alone)
    ran = readme_section(_results(quick=False))
    assert f"parallelism {s.parallelism}, a slow stage of {s.record_cost_ms:g} ms per record" in ran
