"""Timers benchmark: unaligned checkpoints while bursts of event-time timers fire, against the same pipeline
without timers, in one run; and how the output watermark advances while a burst drains.

    overtake bench timers [--seconds 30] [--out bench-results]      (or: python -m benchmarks.timers)

The pipeline: one unbounded source (two partitions, a steady rate of records, event time running with the wall
clock) sends a watermark every ``--watermark-every`` ms; a keyed stage registers one event-time timer per record,
``--timer-delay`` ms after it, and each firing costs ``--cost`` ms. Every watermark therefore makes a burst of
thousands of timers due at once, with distinct timestamps. A probe after it records, for every result, when it
arrived and the watermark it arrived under. The baseline does the same work per record at once, without timers.

Reported: checkpoint duration (coordinator's end-to-end) of checkpoints triggered during a burst, outside bursts,
and without timers; the keyed stage's barrier delay (trigger to the barrier taken there); the burst lengths (what a
checkpoint would wait if timers held barriers back); and per burst, how often the downstream watermark advanced and
the longest it stood still while the burst drained.

Writes ``timers.md`` and ``timers.json`` into ``--out``. Needs Java 17+; the coordinator runs embedded (SQLite).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spark_plugin import Pipeline
from spark_plugin.api.timers import KeyedProcessFunction
from spark_plugin.api.watermarks import WatermarkStrategy
from spark_plugin.connectors import CollectSink
from spark_plugin.connectors.event_sequence import EventSequenceSource

ROOT = Path(__file__).resolve().parents[1]
TASKS = 4  # source, two keyed subtasks, the probe with its sink


@dataclass
class Settings:
    seconds: float = 30.0
    rate: int = 2000
    """Records per second from the source (event time runs with the wall clock)."""
    keys: int = 1000
    timer_delay_ms: int = 1000
    watermark_every_ms: int = 2000
    cost_ms: float = 0.25
    checkpoint_interval_ms: int = 500
    parallelism: int = 2

    @classmethod
    def quick(cls) -> Settings:
        return cls(seconds=12.0)


def now_ms() -> int:
    return int(time.time() * 1000)


class Expire(KeyedProcessFunction):
    """One event-time timer per record, ``delay`` ms after it; a firing costs ``cost_s`` and emits ``(key, ts,
    fired_at)``. Without timers, the same work and output per record at once."""

    def __init__(self, delay_ms: int, cost_s: float, timers: bool) -> None:
        self.delay_ms, self.cost_s, self.timers = delay_ms, cost_s, timers

    def process(self, key, record, ctx):
        at = record[1] + self.delay_ms + record[2]  # + the partition: distinct timestamps
        if self.timers:
            ctx.register_event_time_timer(at)
            return None
        time.sleep(self.cost_s)
        return [(key, at, now_ms())]

    def on_timer(self, key, timestamp, ctx):
        time.sleep(self.cost_s)
        return [(key, timestamp, now_ms())]


class Probe(KeyedProcessFunction):
    """Records each result's arrival time and the watermark it arrived under: ``(arrived, watermark, ts,
    fired_at)``."""

    def process(self, key, record, ctx):
        return [(now_ms(), ctx.watermark, record[1], record[2])]


def ts(r):
    return r[1]


def first(_r):
    return 0


def key(r):
    return r[0]


def pipeline(name: str, s: Settings, timers: bool) -> Pipeline:
    partitions = 2
    src = EventSequenceSource(count=None, partitions=partitions, keys=s.keys, skew=0.0,
                              interval_ms=int(1000 * partitions / s.rate), rate=s.rate, start_ms=now_ms())
    strategy = WatermarkStrategy.for_monotonous_timestamps(ts).with_interval(s.watermark_every_ms)
    p = Pipeline(name, parallelism=s.parallelism)
    (
        p.source(src, id="events", parallelism=1, watermarks=strategy)
        .key_by(key)
        .process(Expire(s.timer_delay_ms, s.cost_ms / 1000, timers), id="expire")
        .key_by(first)
        .process(Probe(), id="probe", parallelism=1, timestamp=ts)
        .sink(CollectSink(), id="arrivals", parallelism=1)
    )
    return p


# ------------------------------------------------------------------------------------------------ statistics


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return float(xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))])


@dataclass
class Burst:
    start: int
    end: int
    timers: int
    watermark_advances: int
    longest_still_ms: int
    """The longest time, while the burst's results arrived, between two advances of the probe's watermark (or
    between the burst's first result and the first advance)."""


@dataclass
class Variant:
    label: str
    job_id: int = 0
    results: int = 0
    checkpoints: list[dict] = field(default_factory=list)
    """Completed checkpoints after warm-up: trigger time, end-to-end ms, keyed stage's barrier delay, in a burst."""
    bursts: list[Burst] = field(default_factory=list)
    late_at_probe: int = 0
    """Results that arrived at or behind the probe's watermark: the output watermark passed a result (must be 0)."""

    def durations(self, in_burst: bool | None = None) -> list[float]:
        return [c["e2e"] for c in self.checkpoints if in_burst is None or c["in_burst"] == in_burst]

    def delays(self, in_burst: bool | None = None) -> list[float]:
        return [c["barrier_delay"] for c in self.checkpoints if in_burst is None or c["in_burst"] == in_burst]


def find_bursts(arrivals: list[tuple], gap_ms: int = 250) -> list[Burst]:
    """Group results by firing time: a pause of ``gap_ms`` between two firings separates bursts."""
    rows = sorted(arrivals, key=lambda r: r[3])
    bursts: list[list[tuple]] = []
    for r in rows:
        if bursts and r[3] - bursts[-1][-1][3] <= gap_ms:
            bursts[-1].append(r)
        else:
            bursts.append([r])
    out = []
    for rs in bursts:
        if len(rs) < 50:
            continue  # not a burst: a few stragglers
        by_arrival = sorted(rs, key=lambda r: r[0])
        advances, still, last_change, last_wm = 0, 0, by_arrival[0][0], by_arrival[0][1]
        for arrived, wm, _, _ in by_arrival:
            if wm != last_wm:
                advances += 1
                still = max(still, arrived - last_change)
                last_change, last_wm = arrived, wm
        still = max(still, by_arrival[-1][0] - last_change)
        out.append(Burst(rs[0][3], rs[-1][3], len(rs), advances, still))
    return out


def measure(spark: Any, url: str, s: Settings, timers: bool, status: Callable[[str], None]) -> Variant:
    from client.sync import OvertakeClient
    from contract.models import CheckpointConfig

    label = "timers" if timers else "no timers"
    name = f"bench-timers-{'on' if timers else 'off'}-{int(time.time())}"
    config = CheckpointConfig(interval=s.checkpoint_interval_ms, policy="unaligned", retained=2, timeout=60_000)
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = pipeline(name, s, timers).run(spark, url, checkpoint=config, time_limit=s.seconds)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            outcome["error"] = e

    t = threading.Thread(target=target, name=f"bench {label}", daemon=True)
    started = time.monotonic()
    t.start()
    while t.is_alive():
        t.join(1.0)
        status(f"{label}: {time.monotonic() - started:.0f} s")
    if "error" in outcome:
        raise outcome["error"]
    result = outcome["result"]
    arrivals = result.outputs("arrivals")
    v = Variant(label, result.job_id, len(arrivals))
    v.late_at_probe = sum(1 for _, wm, t_, _ in arrivals if wm is not None and t_ <= wm)
    v.bursts = find_bursts(arrivals) if timers else []
    with OvertakeClient(url) as client:
        cps = sorted(client.list_checkpoints(result.job_id, limit=1000).items, key=lambda c: c.id)
        done = [c for c in cps if c.status.value == "COMPLETED"]
        for c in done[1:]:  # the first waited for Spark to start the tasks
            detail = client.get_checkpoint(result.job_id, c.id)
            delay = max((st.start_delay for st in detail.subtasks if st.vertex == "expire"), default=0)
            in_burst = any(b.start <= c.trigger_timestamp <= b.end for b in v.bursts)
            v.checkpoints.append({"id": c.id, "trigger": c.trigger_timestamp, "e2e": c.end_to_end_duration,
                                  "barrier_delay": delay, "in_burst": in_burst})
    return v


# ------------------------------------------------------------------------------------------------ report


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f} ms"


def markdown(s: Settings, variants: list[Variant], command: str, machine: str) -> str:
    timed = next(v for v in variants if v.label == "timers")
    rows = [("timers, checkpoints triggered during a burst", timed, True),
            ("timers, checkpoints triggered between bursts", timed, False)]
    rows += [("no timers", v, None) for v in variants if v.label == "no timers"]
    lines = [
        "# Timers benchmark",
        "",
        f"`{command}` — {machine}; local Spark `local[{TASKS}]`; embedded coordinator (SQLite).",
        "",
        f"One source at {s.rate:,} records/s (event time with the wall clock) sends a watermark every "
        f"{s.watermark_every_ms:,} ms; the keyed stage (parallelism {s.parallelism}) registers a timer "
        f"{s.timer_delay_ms:,} ms after each record, {s.keys:,} keys; a firing costs {s.cost_ms} ms. Unaligned "
        f"checkpoints every {s.checkpoint_interval_ms} ms, {s.seconds:.0f} s per pipeline, both in one run. "
        "Checkpoint duration is the coordinator's end-to-end time (trigger to last ack); barrier delay is the "
        "keyed stage's start delay (trigger to its barrier being taken), the higher of its two subtasks.",
        "",
        "| checkpoints | count | duration p50 | p90 | max | barrier delay p50 | max |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for title, v, in_burst in rows:
        d, b = v.durations(in_burst), v.delays(in_burst)
        lines.append(f"| {title} | {len(d)} | {_ms(pct(d, 0.5))} | {_ms(pct(d, 0.9))} | "
                     f"{_ms(max(d) if d else None)} | {_ms(pct(b, 0.5))} | {_ms(max(b) if b else None)} |")
    bursts = timed.bursts
    lengths = [b.end - b.start for b in bursts]
    sizes = [b.timers for b in bursts]
    lines += [
        "",
        f"**Bursts:** {len(bursts)}, {statistics.median(sizes) if sizes else 0:,.0f} timers each (median), lasting "
        f"{_ms(pct(lengths, 0.5))} (median, max {_ms(max(lengths) if lengths else None)}): what a checkpoint "
        "triggered at a burst's start would wait if timers held barriers back.",
        "",
        f"**Output watermark while a burst drains:** advanced {statistics.median([b.watermark_advances for b in bursts]) if bursts else 0:.0f} "
        f"times per burst (median); the longest it stood still during a burst was "
        f"{_ms(max((b.longest_still_ms for b in bursts), default=None))} "
        f"(median per burst {_ms(pct([b.longest_still_ms for b in bursts], 0.5))}). "
        f"Results behind the watermark at the probe: {timed.late_at_probe} (must be 0).",
    ]
    return "\n".join(lines) + "\n"


def run(spark: Any, url: str, s: Settings, status: Callable[[str], None] = lambda m: None) -> list[Variant]:
    """Both pipelines, one after the other, against one coordinator and Spark session."""
    return [measure(spark, url, s, True, status), measure(spark, url, s, False, status)]


def write(s: Settings, variants: list[Variant], out: Path, command: str) -> str:
    out.mkdir(parents=True, exist_ok=True)
    machine = f"{os.cpu_count()} cores"
    text = markdown(s, variants, command, machine)
    (out / "timers.md").write_text(text)
    data = {"settings": asdict(s), "variants": [asdict(v) for v in variants]}
    (out / "timers.json").write_text(json.dumps(data, indent=2))
    return text


def spark_session(tasks: int = TASKS) -> Any:
    from spark_plugin.driver.session import spark_session as start

    return start(tasks, "overtake-bench-timers", import_paths=[ROOT])


def standalone(s: Settings, out: Path, command: str, status: Callable[[str], None]) -> str:
    """Start an embedded coordinator (and Spark unless a session is active), run, write the report."""
    from app.local import LocalCoordinator

    spark = spark_session()
    with tempfile.TemporaryDirectory(prefix="overtake-bench-timers-") as tmp:
        coordinator = LocalCoordinator(Path(tmp) / "coordinator", {"OVERTAKE_LOG_LEVEL": "WARNING"}).start()
        try:
            variants = run(spark, coordinator.url, s, status)
        finally:
            coordinator.stop()
    return write(s, variants, out, command)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.timers", description=__doc__.splitlines()[0])
    d = Settings()
    ap.add_argument("--seconds", type=float, default=d.seconds, help=f"length of each pipeline's run (default {d.seconds:.0f})")
    ap.add_argument("--rate", type=int, default=d.rate, help=f"records per second (default {d.rate})")
    ap.add_argument("--keys", type=int, default=d.keys, help=f"distinct keys (default {d.keys})")
    ap.add_argument("--cost", type=float, default=d.cost_ms, help=f"ms per timer firing (default {d.cost_ms})")
    ap.add_argument("--watermark-every", type=int, default=d.watermark_every_ms,
                    help=f"ms between the source's watermarks: the burst period (default {d.watermark_every_ms})")
    ap.add_argument("--timer-delay", type=int, default=d.timer_delay_ms, help="ms from a record to its timer")
    ap.add_argument("--interval", type=int, default=d.checkpoint_interval_ms, help="checkpoint interval in ms")
    ap.add_argument("--quick", action="store_true", help="shorter runs")
    ap.add_argument("--out", type=Path, default=Path("bench-results"), help="results folder (default bench-results)")
    return ap.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    s = Settings(seconds=args.seconds, rate=args.rate, keys=args.keys, cost_ms=args.cost,
                 watermark_every_ms=args.watermark_every, timer_delay_ms=args.timer_delay,
                 checkpoint_interval_ms=args.interval)
    if args.quick:
        s.seconds = min(s.seconds, Settings.quick().seconds)
    return s


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    text = standalone(settings_from(args), args.out, " ".join(["python -m benchmarks.timers", *argv]),
                      lambda m: print(m, file=sys.stderr))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
