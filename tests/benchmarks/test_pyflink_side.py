"""Overtake beside PyFlink (``benchmarks.pyflink_side``): the report gives each side's row and the ratios of one
run; a PyFlink job that cannot run fails with its error. The PyFlink runs themselves need PyFlink's own environment
(``scripts/pyflink-env.sh``) and are measured by the benchmark, not here; timings are never asserted."""

from __future__ import annotations

import sys

import pytest

from benchmarks.pyflink_side import markdown, pyflink, row


def test_the_report_gives_each_sides_figures_and_their_ratios_per_depth():
    rows = [row("Overtake", 1, [10.0, 12.0, 14.0], [100 * 1024.0], 1500.0, 3),
            row("PyFlink 2.3 (thread mode)", 1, [20.0, 24.0, 28.0], [400 * 1024.0], 1000.0, 3)]
    text = markdown(rows, 40.0, "python -m benchmarks.pyflink_side")
    assert "| 1 | Overtake | 3 | 12 ms | 14 ms | 100 KiB | 100 KiB | 1,500 |" in text
    assert "| 1 | PyFlink 2.3 (thread mode) | 3 | 24 ms | 28 ms | 400 KiB | 400 KiB | 1,000 |" in text
    assert "Depth 1: Overtake's p50 0.50× PyFlink's, its records/s 1.50× PyFlink's." in text


def test_a_pyflink_job_that_cannot_run_fails_with_its_error():
    with pytest.raises(RuntimeError, match="the PyFlink job at depth 1 failed: .*pyflink"):
        pyflink(1, 1.0, 1.0, sys.executable)  # the project's Python: no pyflink there
