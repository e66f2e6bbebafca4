"""The state-paths benchmark (``overtake bench state``): the large-state run's interval sized to the disk, and which
large-state run its target reads, with the runs replaced by made-up ones. No timing is asserted."""

from __future__ import annotations

from benchmarks import state_paths
from benchmarks.flip76 import RunStats

MIB = 1 << 20


def _large(path: str, what: str, durations: list[int], persisted: int) -> state_paths.PathRun:
    stats = RunStats(f"large-{path}", what, "unaligned", 1, 20, completed=len(durations), durations_ms=durations,
                     persisted_bytes=[persisted] * len(durations))
    return state_paths.PathRun(path, what, stats)


def test_the_interval_is_twice_the_raw_write_of_the_state_rounded_up_and_never_below_the_default():
    # 289 MiB at 271 MiB/s: 1.07 s once, 2.13 s twice -> 2.5 s
    assert state_paths.disk_sized_interval_ms(289 * MIB, 271.0, 1000) == 2500
    # a fast disk writes it twice within the default interval: the default stays
    assert state_paths.disk_sized_interval_ms(289 * MIB, 900.0, 1000) == 1000
    assert state_paths.disk_sized_interval_ms(250 * MIB, 250.0, 1000) == 2000  # exactly 2 s: no rounding up
    # nothing measured: the default
    assert state_paths.disk_sized_interval_ms(0, 271.0, 1000) == 1000
    assert state_paths.disk_sized_interval_ms(289 * MIB, 0.0, 1000) == 1000


def _result(sized: int | None) -> state_paths.StatePathsResult:
    r = state_paths.StatePathsResult(settings={"interval_ms": 1000, "parallelism": 2, "large_seconds": 20,
                                               "record_cost_ms": 1, "large_raw_mib_s": 271.0,
                                               "large_sized_interval_ms": sized or 1000})
    r.large_runs = [_large("direct", "large", [1200, 1250, 1300], 289 * MIB),
                    _large("coordinator", "large", [4600, 4700], 289 * MIB)]
    if sized:
        r.large_runs += [_large("direct", "large, sized interval", [1100, 1150, 1200], 289 * MIB),
                         _large("coordinator", "large, sized interval", [4500, 4800], 289 * MIB)]
    return r


def _large_target(r: state_paths.StatePathsResult) -> state_paths.Target:
    (t,) = [t for t in state_paths.targets(r) if t.name.startswith("large state")]
    return t


def test_without_a_sized_run_the_target_reads_the_one_second_run():
    t = _large_target(_result(None))
    assert "1,000 ms interval" in t.name and t.met is False  # direct 1,250 ms misses 1 s
    assert "direct p50 1,250 ms" in t.measured


def test_with_a_sized_run_the_target_reads_it_and_names_the_one_second_run_too():
    r = _result(2500)
    t = _large_target(r)
    assert "2,500 ms interval" in t.name and "271 MiB/s" in t.name
    assert t.met is True  # direct 1,150 ms within 2.5 s, through the coordinator 4,650 ms not
    assert "at 1,000 ms: direct p50 1,250 ms" in t.detail
    text = state_paths.markdown(r, "overtake bench state", "test machine")
    assert "| 2,500 ms | direct |" in text and "| 1,000 ms | through the coordinator |" in text


def test_a_sized_run_the_coordinator_also_finishes_is_a_miss():
    r = _result(2500)
    r.large_runs[-1] = _large("coordinator", "large, sized interval", [2000, 2100], 289 * MIB)
    assert _large_target(r).met is False
