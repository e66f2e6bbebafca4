"""The event-time demo scenario's pipeline (``cli.demo_event_time``), run as threads: every event is counted in its
window or reported late, and late records within the lateness update their window."""

from __future__ import annotations

from cli import demo_event_time as demo
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.fakes import InMemoryCoordinator


def test_every_event_is_counted_in_its_window_or_reported_late():
    count = 300
    coord = InMemoryCoordinator()
    # one source subtask and a watermark after every event: which events are late depends on the input alone
    p = demo.build_pipeline("demo-evt", parallelism=1, count=count, rate=None, watermark_interval=0)
    run = ThreadedRun(p, coord.reporter, coord.events)
    results = run.start().join(60)
    out = {k for r in results for k in r.outputs}
    windows = [w for r in results for w in r.outputs.get("windows", {}).get("records", [])]
    late = [x for r in results for x in r.outputs.get("late", {}).get("records", [])]
    assert set(out) == {"windows", "late"}
    final: dict = {}
    for k, s, _, n in windows:
        final[(k, s)] = max(final.get((k, s), 0), n)
    assert sum(final.values()) + len(late) == 4 * count
    assert late and len(windows) > len(final)  # late records on the side, and late updates of windows


def test_event_time_starts_at_the_wall_clock_and_runs_long_enough_to_watch_its_watermark():
    import time

    before = int(time.time() * 1000)
    source = demo.events(demo.COUNT, demo.REAL_TIME_RATE)
    assert before - demo.WINDOW_MS < source.start_ms <= int(time.time() * 1000)  # not 1970
    # at the scenario's rate event time advances as fast as the wall clock (per partition of speed 1) ...
    assert demo.REAL_TIME_RATE / demo.PARTITIONS * demo.INTERVAL_MS == 1000
    # ... for long enough to watch the watermark move in the UI
    assert demo.PARTITIONS * demo.COUNT / demo.REAL_TIME_RATE >= 20
