"""The batches-against-records benchmark on a tiny input: the batch path, the record path and Spark Structured
Streaming each count every event exactly once (the batch path also with its channel state compressed) (the windows' counts sum to the events), the report renders, and the
scenario is reachable from ``overtake bench``. Timings are measured but never asserted."""

from __future__ import annotations

import pytest

from benchmarks import cli
from benchmarks.batches import (
    PYFLINK_MISSING,
    PathRun,
    Settings,
    markdown,
    measure_overtake,
    measure_structured_streaming,
    pyflink_python,
    pyflink_run,
    write_events,
)

pytestmark = [pytest.mark.spark]

EVENTS, FILES, KEYS, WINDOW = 20_000, 4, 7, 1000


def expected_windows() -> int:
    per_file = EVENTS // FILES
    return len({(f, (i + f) % KEYS, (f * per_file + i) // WINDOW) for f in range(FILES) for i in range(per_file)})


def test_every_path_counts_every_event_once_and_the_report_renders(spark, coordinator, tmp_path):
    s = Settings(events=EVENTS, record_events=0, files=FILES, keys=KEYS, window_ms=WINDOW, interval_ms=200,
                 batch_rows=1000)
    paths = write_events(tmp_path / "events", EVENTS, FILES, KEYS)
    assert len(paths) == FILES
    batch = measure_overtake(spark, coordinator.url, paths, EVENTS, s, batches=True)
    record = measure_overtake(spark, coordinator.url, paths, EVENTS, s, batches=False)
    zstd = measure_overtake(spark, coordinator.url, paths, EVENTS, s, True, "zstd")
    ss = measure_structured_streaming(spark, tmp_path / "events", EVENTS, s)
    for run in (batch, record, zstd, ss):
        assert run.counted == EVENTS, (run.label, run.counted)
        assert run.windows == expected_windows(), (run.label, run.windows)
        assert run.seconds > 0 and run.cores >= 1
    flink = pyflink_run(EVENTS, s)
    if pyflink_python() is not None:  # PyFlink's environment exists here (scripts/pyflink-env.sh)
        assert flink.counted == EVENTS and flink.windows == expected_windows(), (flink.counted, flink.windows)
    text = markdown(s, [batch, zstd, record, flink, ss], "overtake bench batches", "2 cores")
    assert "| batch path | 20,000 |" in text and "| record path | 20,000 |" in text
    assert "| batch path, zstd | 20,000 |" in text
    assert "Spark Structured Streaming" in text
    if not flink.events:
        assert PYFLINK_MISSING in text


def test_a_pyflink_job_that_cannot_run_is_reported_not_measured_with_its_error(tmp_path):
    import sys

    s = Settings(events=EVENTS, files=FILES, keys=KEYS, window_ms=WINDOW)
    run = pyflink_run(EVENTS, s, python=sys.executable)  # the project's Python: no pyflink there
    assert not run.events and "the PyFlink job failed" in run.note and "pyflink" in run.note, run.note


def test_the_scenario_is_reachable_from_overtake_bench():
    assert cli.bench_args(["17"]).chosen == cli.bench_args(["batches"]).chosen == ["batches"]
    assert "batches" in cli.bench_args([]).chosen


def test_the_report_names_the_checkpoints_left_out_after_the_input():
    """A checkpoint triggered after the last windows fired holds nothing in flight: the report counts it apart."""
    run = PathRun("batch path", events=10, seconds=1.0, cores=2, windows=1, counted=10, checkpoints_ms=[40, 60],
                  checkpoints_after=1)
    text = markdown(Settings(), [run], "overtake bench batches", "2 cores")
    assert "| 2 (+1 after) | 40 ms |" in text
