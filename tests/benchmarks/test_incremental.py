"""Scenario 11's arithmetic: bytes written per checkpoint with incremental channel state off and on. No timings."""

from __future__ import annotations

from types import SimpleNamespace

from benchmarks import cli
from benchmarks.incremental import IncrementalSettings, markdown, reduction, summarize


def _cp(id, status, written=0, in_flight=0, reason=None, savepoint=False):
    return SimpleNamespace(
        id=id, status=SimpleNamespace(value=status), state_size=written, persisted_data=in_flight,
        failure_reason=reason, is_savepoint=savepoint,
    )


def test_a_run_counts_completed_checkpoints_after_the_first_and_averages_what_they_wrote():
    cps = [
        _cp(1, "COMPLETED", written=9000, in_flight=8000),  # nothing before it to reference: left out
        _cp(2, "COMPLETED", written=1000, in_flight=8000),
        _cp(3, "COMPLETED", written=3000, in_flight=6000),
        _cp(4, "COMPLETED", written=500, in_flight=500, savepoint=True),
        _cp(5, "ABORTED", reason="expired: 1 of 4 acked"),
        _cp(6, "ABORTED", reason="job_ended: FINISHED"),
    ]
    r = summarize("incremental", True, cps)
    assert (r.completed, r.failed) == (2, 1)
    assert r.written_per_checkpoint == 2000 and r.written_p50 == 2000
    assert r.in_flight_per_checkpoint == 7000 and r.written_total == 4000


def test_the_reduction_compares_bytes_written_per_checkpoint():
    off = summarize("everything written", False, [_cp(1, "COMPLETED", 9), _cp(2, "COMPLETED", 8000)])
    on = summarize("incremental", True, [_cp(1, "COMPLETED", 9), _cp(2, "COMPLETED", 2000)])
    assert reduction(off, on) == 0.75
    assert reduction(summarize("x", False, []), on) is None
    text = markdown([off, on], IncrementalSettings(), "overtake bench incremental", "2 CPUs")
    assert "75% fewer bytes per checkpoint" in text and "| incremental | 1 | 0 | 2 KiB |" in text


def test_scenario_eleven_is_named_by_its_number_and_runs_after_the_others():
    args = cli.bench_args(["11", "9"], quick=True)
    assert args.chosen == ["adaptive", "incremental"]
    assert "overtake bench adaptive incremental --quick" == args.command()
