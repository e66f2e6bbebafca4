"""The timers benchmark's analysis, without Spark: bursts found from firing times, the downstream watermark's
advances during each, and the scenario reachable from ``overtake bench``."""

from __future__ import annotations

from benchmarks import cli
from benchmarks.timers import Settings, Variant, find_bursts, markdown


def arrivals(start: int, n: int, step_wm_every: int) -> list[tuple]:
    """``n`` results fired 1 ms apart from ``start``, arriving 5 ms later; the watermark moves every few."""
    return [(start + i + 5, start + (i // step_wm_every) * step_wm_every, start + 10_000 + i, start + i)
            for i in range(n)]


def test_bursts_are_separated_by_pauses_and_count_the_watermarks_advances():
    rows = arrivals(0, 400, 100) + arrivals(2000, 300, 300) + [(5000, 0, 9, 5000)]
    bursts = find_bursts(rows)
    assert [(b.start, b.end, b.timers) for b in bursts] == [(0, 399, 400), (2000, 2299, 300)]
    assert [b.watermark_advances for b in bursts] == [3, 0]
    assert bursts[1].longest_still_ms == 299  # the watermark never moved while the second burst arrived


def test_the_report_tells_checkpoints_in_bursts_apart():
    timed = Variant("timers", checkpoints=[
        {"id": 2, "trigger": 10, "e2e": 100, "barrier_delay": 5, "in_burst": True},
        {"id": 3, "trigger": 900, "e2e": 50, "barrier_delay": 2, "in_burst": False},
    ], bursts=find_bursts(arrivals(0, 400, 100)))
    text = markdown(Settings(), [timed, Variant("no timers")], "overtake bench timers", "2 cores")
    assert "| timers, checkpoints triggered during a burst | 1 | 100 ms |" in text
    assert "Results behind the watermark at the probe: 0" in text


def test_the_timers_scenario_is_part_of_overtake_bench():
    assert cli.bench_args(["6"]).chosen == ["timers"]
    assert "timers" in cli.bench_args([]).chosen
