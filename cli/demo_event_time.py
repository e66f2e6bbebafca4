"""The event-time demo scenario: counts per key in 5-second event-time windows over out-of-order events from
partitions whose clocks run at different speeds, with 2 s of allowed lateness; records later than that go to a side
output. Checkpoints are unaligned, so watermarks, timers and window contents are in every one of them.

``run_scenario(spark, coordinator_url, console)`` builds the pipeline, runs it and prints the windows as they were
emitted (a window that late records updated shows each of its firings) and the late records; ``overtake demo`` runs
it after the backpressure runs (``--no-event-time`` leaves it out).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from spark_plugin import Pipeline
from spark_plugin.api.watermarks import WatermarkStrategy
from spark_plugin.api.windows import TumblingEventTimeWindows
from spark_plugin.connectors import CollectSink
from spark_plugin.connectors.event_sequence import EventSequenceSource

WINDOW_MS = 5_000
LATENESS_MS = 2_000
OUT_OF_ORDER_MS = 500


def event_time(record: tuple) -> int:
    """``(key, timestamp, partition, n)``: the event time is the second field."""
    return record[1]


def key_of(record: tuple) -> int:
    return record[0]


PARTITIONS = 4
INTERVAL_MS = 50
"""Event time a partition advances per record (its speed 1; one partition runs at twice the speed)."""
REAL_TIME_RATE = PARTITIONS * 1000 / INTERVAL_MS
"""Records per second (one source subtask) at which event time advances as fast as the wall clock, so the
watermark the UI shows moves along with it, a few hundred milliseconds behind."""
SECONDS = 30
COUNT = SECONDS * 1000 // INTERVAL_MS
"""Records per partition: the scenario runs about SECONDS seconds, long enough to watch its watermark live."""


def wall_clock_start() -> int:
    """Event time starts now (rounded down to a window), not at the epoch: the watermark is today's time."""
    return int(time.time() * 1000) // WINDOW_MS * WINDOW_MS


def events(count: int, rate: float | None, start_ms: int | None = None) -> EventSequenceSource:
    return EventSequenceSource(count=count, partitions=PARTITIONS, keys=4, skew=1.0, interval_ms=INTERVAL_MS,
                               speeds=[1, 1, 2, 1], disorder_ms=OUT_OF_ORDER_MS, late_every=40, late_ms=4_000,
                               rate=rate, start_ms=wall_clock_start() if start_ms is None else start_ms)


def build_pipeline(name: str, parallelism: int = 1, count: int = COUNT, rate: float | None = REAL_TIME_RATE,
                   watermark_interval: int = 200, start_ms: int | None = None) -> Pipeline:
    """events -> watermarks (500 ms out of order, 1 s idleness, every ``watermark_interval`` ms) -> key_by -> 5 s
    windows, 2 s lateness -> counts; the records too late for their window -> late records."""
    p = Pipeline(name, parallelism=parallelism)
    watermarks = (
        WatermarkStrategy.for_bounded_out_of_orderness(OUT_OF_ORDER_MS, event_time)
        .with_idleness(1_000)
        .with_interval(watermark_interval)
    )
    counts = (
        p.source(events(count, rate, start_ms), id="events", watermarks=watermarks)
        .key_by(key_of)
        .window(TumblingEventTimeWindows.of(WINDOW_MS), allowed_lateness=LATENESS_MS)
        .aggregate(lambda: 0, lambda n, _record: n + 1, id="counts")
    )
    counts.sink(CollectSink(), id="windows")
    counts.late_records().sink(CollectSink(), id="late")
    return p


def tasks_needed(parallelism: int) -> int:
    """Spark task slots the scenario needs: sources, windows, their results' sink, the late records' sink."""
    return 4 * parallelism


def clock(ms: int) -> str:
    """An event time as the local time of day (event time is wall-clock time here)."""
    return time.strftime("%H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000 // 100}"


def window_table(windows: list[tuple]) -> Any:
    """One row per key and window with its final count and how often it fired (more than once: late updates)."""
    from rich.table import Table

    fired = Counter((k, s) for k, s, _, _ in windows)
    final: dict[tuple, int] = {}
    for k, s, _, n in windows:
        final[(k, s)] = max(final.get((k, s), 0), n)
    t = Table(title=f"counts per key, {WINDOW_MS // 1000} s event-time windows ({LATENESS_MS // 1000} s lateness)")
    for col in ("window", "key", "count", "fired"):
        t.add_column(col, justify="left" if col == "window" else "right")
    for (k, s), n in sorted(final.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        t.add_row(f"[{clock(s)}, {clock(s + WINDOW_MS)})", str(k), str(n),
                  f"{fired[(k, s)]}" + (" (late updates)" if fired[(k, s)] > 1 else ""))
    return t


def run_scenario(spark: Any, coordinator: str, console: Any, name: str = "demo-event-time", parallelism: int = 1,
                 count: int = COUNT, rate: float | None = REAL_TIME_RATE) -> dict[str, Any]:
    """Run the event-time pipeline once and print its windows and late records; returns a summary."""
    from contract.models import CheckpointConfig

    pipeline = build_pipeline(name, parallelism, count, rate)
    live = f" for about {PARTITIONS * count / rate:.0f} s" if rate else ""
    console.print(f"running {name}: {PARTITIONS * count:,} events, watermarks {OUT_OF_ORDER_MS} ms behind, "
                  f"{WINDOW_MS // 1000} s windows, {LATENESS_MS // 1000} s allowed lateness, unaligned checkpoints; "
                  f"event time is the wall clock's: its job page in the UI shows the watermark live{live}")
    result = pipeline.run(spark, coordinator, checkpoint=CheckpointConfig(interval=500, policy="unaligned"))
    windows, late = result.outputs("windows"), result.outputs("late")
    console.print(window_table(windows))
    updates = len(windows) - len({(k, s) for k, s, _, _ in windows})
    console.print(f"{len(late)} records were too late for their window (side output), e.g. "
                  + ", ".join(f"key {k} at {clock(t)}" for k, t, _, _ in sorted(late)[:3]))
    console.print(f"{updates} window firings were late updates (records behind the watermark, within the lateness)")
    return {"job_id": result.job_id, "status": result.status, "windows": len(windows), "late_updates": updates,
            "late_records": len(late)}
