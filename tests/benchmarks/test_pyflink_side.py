"""Overtake beside PyFlink (``benchmarks.pyflink_side``): the report gives each side's row and the ratios of one
run; a PyFlink job that cannot run fails with its error. The PyFlink runs themselves need PyFlink's own environment
(``scripts/pyflink-env.sh``) and are measured by the benchmark, not here; timings are never asserted."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from benchmarks.pyflink_side import PARTS, attribution, job_subtasks, markdown, pyflink, row, split


def _floor(subtasks):
    return {"subtasks": subtasks, "bytes_per_subtask": 25 * 1024, "relay_p50": 8.0, "relay_write_span_p50": 3.0,
            "relay_control_p50": 5.0, "disk_floor_p50": 2.0, "commit_floor_p50": 1.0, "request_floor_p50": 3.0,
            "floor_p50": 6.0}


def test_the_report_gives_each_sides_figures_their_ratios_and_the_floor_per_depth():
    o1 = row("Overtake", 1, [10.0, 12.0, 14.0], [100 * 1024.0], 1500.0, 3)
    o1["parts"] = dict(zip(PARTS, [2.0, 0.0, 1.0, 5.0, 1.0, 3.0], strict=True))
    o1["floor"] = _floor(4)
    o3 = row("Overtake", 3, [18.0, 18.0, 30.0], [200 * 1024.0], 1400.0, 3)
    rows = [o1, row("PyFlink 2.3 (thread mode)", 1, [20.0, 24.0, 28.0], [400 * 1024.0], 1000.0, 3),
            row("PyFlink 2.3 (thread mode), checkpoints in files", 1, [30.0, 30.0, 30.0], [400 * 1024.0], 750.0, 3),
            o3]
    text = markdown(rows, 40.0, "python -m benchmarks.pyflink_side")
    assert "| 1 | Overtake | 3 | 12 ms | 14 ms | 100 KiB | 100 KiB | 1,500 |" in text
    assert "| 1 | PyFlink 2.3 (thread mode) | 3 | 24 ms | 28 ms | 400 KiB | 400 KiB | 1,000 |" in text
    assert "Depth 1, against PyFlink 2.3 (thread mode): Overtake's p50 0.50×, its records/s 1.50×." in text
    assert "against PyFlink 2.3 (thread mode), checkpoints in files: Overtake's p50 0.40×, its records/s 2.00×." in text
    assert "| 1 | 12 ms | 2.0 ms | 0.0 ms | 1.0 ms | 5.0 ms | 1.0 ms | 3.0 ms |" in text
    assert "| 1 | 4 × 25 KiB | 8.0 ms | 3.0 ms | 5.0 ms | 6.0 ms | 2.0 ms | 1.0 ms | 3.0 ms |" in text
    assert "Depth 1: Overtake's p50 is 2.00× the machine's floor for its bytes (6.0 ms) and 1.50× its ack path" in text
    assert "Overtake's p50 at depth 3 against depth 1: 1.50×." in text


def _st(e2e, start_delay, alignment, sync, async_):
    return SimpleNamespace(end_to_end_duration=e2e, start_delay=start_delay, alignment_duration=alignment,
                           sync_duration=sync, async_duration=async_)


def test_a_checkpoint_is_split_at_the_subtask_that_acked_last_and_the_parts_add_up():
    cp = SimpleNamespace(end_to_end_duration=20, subtasks=[_st(9, 1, 0, 1, 6), _st(15, 4, 2, 1, 5), _st(12, 1, 0, 1, 9)])
    parts = split(cp)
    assert parts == dict(zip(PARTS, [4.0, 2.0, 1.0, 5.0, 3.0, 5.0], strict=True))
    assert sum(parts.values()) == cp.end_to_end_duration
    assert split(SimpleNamespace(end_to_end_duration=20, subtasks=[])) is None
    other = dict(zip(PARTS, [6.0, 0.0, 3.0, 7.0, 1.0, 1.0], strict=True))
    third = dict(zip(PARTS, [8.0, 0.0, 2.0, 9.0, 1.0, 7.0], strict=True))
    assert attribution([parts, other, third])["to the barrier"] == 6.0
    assert attribution([]) == {}
    assert job_subtasks(3, 2) == 10


def test_a_pyflink_job_that_cannot_run_fails_with_its_error():
    with pytest.raises(RuntimeError, match="the PyFlink job at depth 1 failed: .*pyflink"):
        pyflink(1, 1.0, 1.0, sys.executable)  # the project's Python: no pyflink there
