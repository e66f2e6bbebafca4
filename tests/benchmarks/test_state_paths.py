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


def _ack_path(commit_floor: list[float]) -> state_paths.StatePathsResult:
    from benchmarks.ackpath import AckPathStats

    a = AckPathStats(8, 3, MIB)
    a.relay_ms = [29.0, 30.0, 31.0]
    a.relay_write_span_ms = [13.0, 14.0, 15.0]
    a.relay_control_ms = [15.0, 16.0, 17.0]
    a.disk_floor_ms = [12.0, 13.0, 14.0]
    a.commit_floor_ms = commit_floor
    a.request_floor_ms = [0.4, 0.5, 0.6]
    r = state_paths.StatePathsResult(settings={"interval_ms": 1000, "parallelism": 2, "large_seconds": 20,
                                               "record_cost_ms": 1})
    r.ack_path = a
    return r


def test_the_ack_path_target_names_this_machines_floor_as_the_sum_of_its_parts():
    r = _ack_path([2.0, 2.5, 3.0])
    assert r.ack_path.floor_p50 == 13.0 + 2.5 + 0.5
    (t,) = [t for t in state_paths.targets(r) if t.name.startswith("ack path")]
    assert t.met is False and "30.0 ms through the host's relay" in t.measured
    assert ("the 8 MiB durable as one file 13.0 ms, one PostgreSQL commit 2.5 ms and one request with no database "
            "work 0.5 ms: 16.0 ms") in t.measured
    assert "one PostgreSQL commit 2.5 ms" in state_paths.markdown(r, "overtake bench state", "test machine")


def test_without_a_commit_measured_no_floor_is_claimed():
    r = _ack_path([])
    assert r.ack_path.floor_p50 is None
    (t,) = [t for t in state_paths.targets(r) if t.name.startswith("ack path")]
    assert "floor for it" not in t.measured


def test_the_commit_floor_commits_a_row_in_postgresql_and_leaves_nothing_behind(pg_url):
    import psycopg

    from benchmarks.ackpath import _ControlFloor

    plain = pg_url.replace("+asyncpg", "", 1)
    floor = _ControlFloor("http://127.0.0.1:9", pg_url)  # no request is sent: only the commit is timed here
    try:
        assert floor.commit_ms() > 0
        assert floor.commit_ms() > 0
        with psycopg.connect(plain) as other:  # committed: another connection sees both rows
            assert other.execute(f"SELECT count(*) FROM {_ControlFloor.TABLE}").fetchone()[0] == 2
    finally:
        floor.close()
    with psycopg.connect(plain) as other:
        assert other.execute("SELECT to_regclass(%s)", (_ControlFloor.TABLE,)).fetchone()[0] is None
