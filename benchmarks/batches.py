"""Batches against records (``overtake bench batches``): a keyed tumbling-window count over Parquet files of events,
with no per-record cost of its own, on the record path, on the batch path, and on Spark Structured Streaming.

The input: ``files`` Parquet files of ``events`` rows ``(key int64, ts int64 epoch ms, value int64)`` in all,
``keys`` keys round robin. File ``f`` holds its own stretch of event time, one event per ms in order, so a tumbling
window of ``window_ms`` holds ``window_ms`` events of file ``f`` and the files' windows do not overlap (each file is
one split, read round robin with a watermark per split; Spark reads one file per micro-batch in order).

* *batch path*: ``ParquetSource(batches=True)`` with a watermark strategy on ``ts`` → ``key_by("key")`` →
  ``window(TumblingEventTimeWindows.of(window_ms)).aggregate({"value": ["count"]})`` → a sink that counts rows;
* *record path*: ``ParquetSource`` (one dict per row) → ``key_by(lambda r: r["key"])`` → ``window(...)
  .aggregate(zero, add)`` counting → the same sink, over ``record_events`` (fewer: it is the slow path; a rate is
  per second, so a smaller input gives a fair rate when the run is long enough);
* *Spark Structured Streaming*: ``readStream.parquet`` over the same files (``maxFilesPerTrigger=1``),
  ``withWatermark`` + ``groupBy(window, key).count()`` in update mode, ``trigger(availableNow=True)``, in a
  process of its own on ``local[2]`` (the standalone run) or on the given session (the test);
* *PyFlink*: the same count per record in PyFlink 2.3's thread mode (``benchmarks/pyflink_window_count.py``), in
  PyFlink's own environment (``scripts/pyflink-env.sh``; its pins conflict with the project's) and a process of its
  own, over ``pyflink_events`` events; where that environment is missing the report says so.

What is timed: for the two Overtake paths, from the earliest moment a sink subtask opened (the subtasks open
together, before the source reads its first row) to the latest moment one closed (after the last window fired), as
the sinks' own wall clock says; Spark's job submission and Python worker start are outside it. For Spark Structured
Streaming, from ``start()`` to the end of ``awaitTermination()``. Records per second per core divides by the cores
the job could use: min(task slots the job's subtasks take, CPUs of the machine) for Overtake, min(2, CPUs) for
``local[2]``.

Checkpoints: unaligned every ``interval_ms`` through an embedded coordinator (SQLite); per path, the p50 of the
completed checkpoints' end-to-end duration, the slowest subtask's synchronous phase in each (its operator state's
snapshot, part of that duration), their persisted channel state (``persisted_data``: the in-flight bytes as they
travelled) and what they stored (``state_size``: the blobs' bytes, compressed when the channel state is)
per checkpoint. ``compression``: the batch path runs once per entry, in that order, with
``NetworkConfig.channel_state_compression`` set to it ("none": uncompressed); ``batch_path_only`` leaves out the
record path and Spark.

Writes ``batches.md`` and ``batches.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.report import write_scenario
from spark_plugin.connectors.base import Sink

ROOT = Path(__file__).resolve().parents[1]
PYFLINK_MISSING = "not measured: PyFlink's environment is missing (scripts/pyflink-env.sh makes it)"


@dataclass
class Settings:
    events: int = 30_000_000
    """Events of the batch path and of Spark Structured Streaming: enough for the batch path to run some 7 s, 5
    checkpoints (10,000,000 gave it 2, one of them after its input)."""
    record_events: int = 3_000_000
    """Events of the record path (the first files of the same input; 0: all of them)."""
    files: int = 30
    """Parquet files of the input, each its own stretch of event time (the record path reads the first 3)."""
    keys: int = 100
    window_ms: int = 10_000
    parallelism: int = 2
    interval_ms: int = 1000
    batch_rows: int = 8_192
    """Rows per batch the batch path's source reads. A barrier waits for the source's batch in hand: 8,192 rows gave
    an unaligned p50 of 36–38 ms against 45–54 ms at 16,384 (three runs each), a third of the bytes persisted, at
    some 80 % of the rate (README, "Batches against records")."""
    quick: bool = False
    compression: list[str] = field(default_factory=lambda: ["none"])
    """The batch path runs once per entry, in order, its channel state compressed with it ("none": uncompressed)."""
    batch_path_only: bool = False
    """Only the batch path (and its compressed runs): no record path, no PyFlink, no Spark Structured Streaming."""
    pyflink_events: int = 300_000
    """Events of PyFlink's per-record run (0: as many as the record path's): it moves some 6,000 records a second
    here, so 300,000 make a run of about a minute; a rate is per second, so the smaller input is fair."""

    @classmethod
    def quick_settings(cls, **over: Any) -> Settings:
        return cls(**{"quick": True, "events": 1_000_000, "files": 10, "record_events": 200_000, "pyflink_events": 60_000, **over})


@dataclass
class PathRun:
    """One path's run: what it read and produced, how long it took, its checkpoints."""

    label: str
    events: int = 0
    seconds: float = 0.0
    cores: int = 1
    windows: int = 0
    """Result rows (one per key and window)."""
    counted: int = 0
    """The sum of the windows' counts: equals ``events`` when no event was lost or counted twice."""
    checkpoints_ms: list[int] = field(default_factory=list)
    """End-to-end duration of each checkpoint completed and triggered while the job read its input."""
    checkpoints_after: int = 0
    """Checkpoints completed but triggered once the job's last windows had fired (left out of the figures)."""
    sync_ms: list[int] = field(default_factory=list)
    """Per completed checkpoint, the slowest subtask's synchronous phase (its operator state's snapshot)."""
    persisted_bytes: list[int] = field(default_factory=list)
    stored_bytes: list[int] = field(default_factory=list)
    """``state_size`` per completed checkpoint: operator and channel state as stored (compressed or not)."""
    note: str = ""

    @property
    def rate(self) -> float | None:
        return self.events / self.seconds if self.seconds else None

    @property
    def rate_per_core(self) -> float | None:
        return self.rate / self.cores if self.rate else None

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "records_per_s": self.rate, "records_per_s_per_core": self.rate_per_core,
                "checkpoint_p50": _pct(self.checkpoints_ms, 0.5),
                "sync_p50": _pct(self.sync_ms, 0.5),
                "persisted_p50": _pct(self.persisted_bytes, 0.5),
                "persisted_mean": sum(self.persisted_bytes) / len(self.persisted_bytes) if self.persisted_bytes
                else None,
                "stored_p50": _pct(self.stored_bytes, 0.5)}


def _pct(xs: list[float], q: float) -> float | None:
    d = sorted(xs)
    return float(d[min(len(d) - 1, int(round(q * (len(d) - 1))))]) if d else None


# ------------------------------------------------------------------------------------------------ the input


def write_events(directory: Path, events: int, files: int, keys: int) -> list[Path]:
    """``files`` Parquet files of ``events`` rows in all; file ``f`` starts at event time ``f * per_file`` ms
    (whole windows apart when ``per_file`` is a multiple of the window), one event per ms, keys round robin. Their
    modification times follow their order (Spark's file stream reads the oldest first)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    per_file = -(-events // files)
    paths = []
    now = time.time() - files
    for f in range(files):
        n = min(per_file, events - f * per_file)
        if n <= 0:
            break
        i = np.arange(n, dtype=np.int64)
        table = pa.table({"key": (i + f) % keys, "ts": f * per_file + i, "value": (i * 31 + f) % 97})
        path = directory / f"events-{f:03d}.parquet"
        pq.write_table(table, path, row_group_size=65_536)
        os.utime(path, (now + f, now + f))
        paths.append(path)
    return paths


# ------------------------------------------------------------------------------------------------ Overtake


class CountSink(Sink):
    """Counts result rows and sums their counts; records when it opened and closed (the run's wall time) and when
    the last result came (the end of the job's input: its last windows fire when the sources end)."""

    def __init__(self) -> None:
        self.rows = self.counted = 0
        self.opened = self.last = 0.0

    def open(self, subtask_index: int, parallelism: int) -> None:
        super().open(subtask_index, parallelism)
        self.opened = time.time()

    def write(self, record: Any) -> None:
        self.last = time.time()
        if hasattr(record, "num_rows"):  # the batch path: a batch of (key, window_start, window_end, value_count)
            import pyarrow.compute as pc

            self.rows += record.num_rows
            self.counted += int(pc.sum(record.column("value_count")).as_py() or 0)
        else:  # the record path: (key, start, end, count)
            self.rows += 1
            self.counted += int(record[3])

    def snapshot(self, checkpoint_id: int) -> Any:
        return {"rows": self.rows, "counted": self.counted}

    def restore(self, state: Any) -> None:
        self.rows += state["rows"]
        self.counted += state["counted"]

    def close(self) -> Any:
        return {"rows": self.rows, "counted": self.counted, "opened": self.opened, "closed": time.time(),
                "last": self.last}


def _zero() -> int:
    return 0


def _add_one(acc: int, record: Any) -> int:
    return acc + 1


def _key(r: dict) -> Any:
    return r["key"]


def pipeline(name: str, paths: list[Path], s: Settings, batches: bool) -> Any:
    from spark_plugin import ParquetSource, Pipeline
    from spark_plugin.api.watermarks import WatermarkStrategy
    from spark_plugin.api.windows import TumblingEventTimeWindows

    p = Pipeline(name, parallelism=s.parallelism)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(100, timestamp="ts")
    source = ParquetSource([str(x) for x in paths], batch_rows=s.batch_rows if batches else 1024, batches=batches)
    stream = p.source(source, id="events", watermarks=strategy)
    if batches:
        (stream.key_by("key").window(TumblingEventTimeWindows.of(s.window_ms)).aggregate({"value": ["count"]})
         .sink(CountSink(), id="count"))
    else:
        (stream.key_by(_key).window(TumblingEventTimeWindows.of(s.window_ms)).aggregate(_zero, _add_one)
         .sink(CountSink(), id="count"))
    return p


def tasks_needed(s: Settings, batches: bool = True) -> int:
    """Task slots the job takes (every vertex that does not chain runs its own subtasks)."""
    from spark_plugin.plan.topology import subtask_specs

    return len(subtask_specs(pipeline("plan", [Path("a.parquet")], s, batches).plan()))


def measure_overtake(
    spark: Any, url: str, paths: list[Path], events: int, s: Settings, batches: bool, compression: str | None = None
) -> PathRun:
    """One path over ``paths`` (``events`` rows) with unaligned checkpoints every ``s.interval_ms``, its channel
    state compressed with ``compression`` (None: stored as it travelled)."""
    from client.sync import OvertakeClient
    from contract.models import CheckpointConfig
    from spark_plugin.network.config import NetworkConfig

    label = ("batch path" if batches else "record path") + (f", {compression}" if compression else "")
    name = f"bench-batches-{'batch' if batches else 'record'}-{int(time.time() * 1000)}"
    config = CheckpointConfig(interval=s.interval_ms, policy="unaligned", retained=2, timeout=600_000)
    network = NetworkConfig(channel_state_compression=compression)
    result = pipeline(name, paths, s, batches).run(spark, url, checkpoint=config, network=network)
    if result.status != "finished":
        raise RuntimeError(f"{label}: the job ended {result.status}")
    outs = [x.outputs["count"] for x in result.subtasks if x.outputs.get("count")]
    run = PathRun(label, events=events, cores=min(tasks_needed(s, batches), os.cpu_count() or 1))
    run.seconds = max(o["closed"] for o in outs) - min(o["opened"] for o in outs)
    run.windows = sum(o["rows"] for o in outs)
    run.counted = sum(o["counted"] for o in outs)
    with OvertakeClient(url) as client:
        # the checkpoints triggered while the job read its input; one triggered after the last windows fired holds
        # nothing in flight and almost no state, and in a run with few checkpoints it was the p50
        ended_ms = max(o["last"] for o in outs) * 1000
        done = [c for c in client.list_checkpoints(result.job_id, limit=1000).items if c.status.value == "COMPLETED"]
        cps = [c for c in done if c.trigger_timestamp < ended_ms]
        run.checkpoints_after = len(done) - len(cps)
        run.sync_ms = [max((t.sync_duration for t in client.get_checkpoint(result.job_id, c.id).subtasks), default=0)
                       for c in cps]
    run.checkpoints_ms = [c.end_to_end_duration for c in cps if c.end_to_end_duration is not None]
    run.persisted_bytes = [int(c.persisted_data or 0) for c in cps]
    run.stored_bytes = [int(c.state_size or 0) for c in cps]
    run.note = f"channel state compressed with {compression}" if compression else ""
    return run


# ------------------------------------------------------------------------------------------------ Spark


def measure_structured_streaming(spark: Any, directory: Path, events: int, s: Settings, cores: int = 2) -> PathRun:
    """The same count on Spark Structured Streaming: one file per micro-batch, update mode, collected into a memory
    table (each key and window once per micro-batch that touched it; the largest count is its final one)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StructField, StructType

    schema = StructType([StructField("key", LongType()), StructField("ts", LongType()),
                         StructField("value", LongType())])
    table = f"bench_batches_{int(time.time() * 1000)}"
    with tempfile.TemporaryDirectory(prefix="overtake-bench-batches-ss-") as tmp:
        events_df = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(directory))
                     .withColumn("t", F.timestamp_millis("ts")).withWatermark("t", "100 milliseconds"))
        counts = events_df.groupBy(F.window("t", f"{s.window_ms} milliseconds"), "key").count()
        started = time.perf_counter()
        query = (counts.writeStream.outputMode("update").format("memory").queryName(table)
                 .option("checkpointLocation", tmp).trigger(availableNow=True).start())
        query.awaitTermination()
        seconds = time.perf_counter() - started
        final = spark.sql(f"SELECT window, key, max(count) AS c FROM {table} GROUP BY window, key")
        row = final.agg(F.count("*").alias("windows"), F.sum("c").alias("counted")).collect()[0]
        spark.catalog.dropTempView(table)
    run = PathRun("Spark Structured Streaming", events=events, seconds=seconds,
                  cores=min(cores, os.cpu_count() or 1), windows=int(row["windows"]), counted=int(row["counted"] or 0))
    run.note = "micro-batch, one file per trigger, availableNow, update mode into a memory table"
    return run


def _structured_streaming_alone(directory: Path, events: int, s: Settings) -> PathRun:
    """Spark Structured Streaming in a process of its own on ``local[2]`` (this process's session is wider)."""
    cmd = [sys.executable, "-m", "benchmarks.batches", "--structured-streaming-only", str(directory),
           "--events", str(events), "--window-ms", str(s.window_ms)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=ROOT, timeout=3600)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return PathRun(**{k: v for k, v in data.items() if k in PathRun.__dataclass_fields__})


PYFLINK_ENV = ROOT / ".overtake" / "pyflink" / "bin" / "python"


def pyflink_python() -> str | None:
    """The Python of PyFlink's own environment: ``OVERTAKE_PYFLINK_PYTHON``, else the one ``scripts/pyflink-env.sh``
    makes (None when neither exists)."""
    named = os.environ.get("OVERTAKE_PYFLINK_PYTHON")
    if named:
        return named
    return str(PYFLINK_ENV) if PYFLINK_ENV.exists() else None


def pyflink_run(events: int = 0, s: Settings | None = None, python: str | None = None) -> PathRun:
    """PyFlink 2.3's per-record job over ``events`` events (``benchmarks/pyflink_window_count.py``, thread mode, in
    PyFlink's own environment and a process of its own, at ``s.parallelism``); not measured, saying why, where that
    environment does not exist."""
    label = "PyFlink (per record)"
    python = python or pyflink_python()
    if python is None or not events or s is None:
        return PathRun(label, note=PYFLINK_MISSING)
    with tempfile.TemporaryDirectory(prefix="overtake-bench-pyflink-") as stamps:
        cmd = [python, "-I", str(ROOT / "benchmarks" / "pyflink_window_count.py"), "--events", str(events),
               "--files", str(s.files), "--keys", str(s.keys), "--window-ms", str(s.window_ms),
               "--parallelism", str(s.parallelism), "--interval-ms", str(s.interval_ms), "--stamps", stamps]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=stamps, timeout=3600)
        except subprocess.TimeoutExpired:
            return PathRun(label, note="not measured: the PyFlink job did not finish within an hour")
        if out.returncode != 0:
            last = (out.stderr.strip().splitlines() or ["no output"])[-1][:300]
            return PathRun(label, note=f"not measured: the PyFlink job failed ({last})")
        data = json.loads(out.stdout.strip().splitlines()[-1])
    run = PathRun(label, events=data["events"], seconds=data["seconds"], windows=data["windows"],
                  counted=data["counted"], cores=min(s.parallelism, os.cpu_count() or 1),
                  checkpoints_ms=data.get("checkpoints_ms", []), persisted_bytes=data.get("persisted_bytes", []),
                  stored_bytes=data.get("stored_bytes", []))
    run.note = (f"PyFlink 2.3, {data['mode']} mode, unaligned checkpoints every {s.interval_ms} ms (their figures "
                "from the MiniCluster's REST API, as Flink reports them); events made by a sequence source and a "
                "Python map (no Parquet decoding)")
    return run


# ------------------------------------------------------------------------------------------------ the run


def run(s: Settings, status: Callable[[str], None] = lambda m: None, spark: Any = None) -> list[PathRun]:
    """Write the input, run Spark Structured Streaming (in its own process unless ``spark`` is given), then start an
    embedded coordinator (and local Spark unless given) and run the batch and the record path."""
    from app.local import LocalCoordinator

    runs: list[PathRun] = []
    with tempfile.TemporaryDirectory(prefix="overtake-bench-batches-") as tmp:
        directory = Path(tmp) / "events"
        status(f"writing {s.events:,} events into {s.files} Parquet files")
        paths = write_events(directory, s.events, s.files, s.keys)
        record_paths, record_events = _record_input(paths, s)
        ss = flink = None
        if not s.batch_path_only:
            pyflink_events = s.pyflink_events or record_events
            status(f"PyFlink over {pyflink_events:,} events")
            flink = pyflink_run(pyflink_events, s)
            status("Spark Structured Streaming")
            ss = (measure_structured_streaming(spark, directory, s.events, s) if spark is not None
                  else _structured_streaming_alone(directory, s.events, s))
        coordinator = LocalCoordinator(Path(tmp) / "coordinator", {"OVERTAKE_LOG_LEVEL": "WARNING"}).start()
        try:
            if spark is None:
                from benchmarks.timers import spark_session

                spark = spark_session(max(2, tasks_needed(s, True), tasks_needed(s, False)))
            for codec in s.compression:
                status("batch path" + ("" if codec == "none" else f", channel state compressed with {codec}"))
                runs.append(measure_overtake(spark, coordinator.url, paths, s.events, s, True,
                                             None if codec == "none" else codec))
            if not s.batch_path_only:
                status(f"record path over {record_events:,} events")
                runs.append(measure_overtake(spark, coordinator.url, record_paths, record_events, s, batches=False))
        finally:
            coordinator.stop()
        if ss is not None:
            runs += [flink, ss]
    return runs


def _record_input(paths: list[Path], s: Settings) -> tuple[list[Path], int]:
    """The first files holding at least ``s.record_events`` events (all of them when 0)."""
    import pyarrow.parquet as pq

    if not s.record_events or s.record_events >= s.events:
        return paths, s.events
    chosen, n = [], 0
    for p in paths:
        if n >= s.record_events:
            break
        chosen.append(p)
        n += pq.ParquetFile(p).metadata.num_rows
    return chosen, n


# ------------------------------------------------------------------------------------------------ report


def _n(v: float | None, unit: str = "") -> str:
    return "–" if v is None else f"{v:,.0f}{unit}"


def _bytes(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v / 1e6:,.1f} MB" if v >= 1e6 else f"{v / 1e3:,.1f} kB" if v >= 1e3 else f"{v:,.0f} B"


def ratios(runs: list[PathRun]) -> dict[str, float | None]:
    by = {r.label: r for r in runs}
    b, r, ss = by.get("batch path"), by.get("record path"), by.get("Spark Structured Streaming")
    flink = by.get("PyFlink (per record)")

    def ratio(x: PathRun | None, y: PathRun | None) -> float | None:
        return x.rate_per_core / y.rate_per_core if x and y and x.rate_per_core and y.rate_per_core else None

    return {"batch_over_record": ratio(b, r), "batch_over_structured_streaming": ratio(b, ss),
            "record_over_pyflink": ratio(r, flink), "batch_over_pyflink": ratio(b, flink)}


def markdown(s: Settings, runs: list[PathRun], command: str = "", machine: str = "") -> str:
    head = " — ".join(x for x in (f"`{command}`" if command else "", machine) if x)
    lines = [
        "## Batches against records: a keyed tumbling-window count\n",
        (f"{head}. " if head else "") +
        f"{s.events:,} events (key, ts, value) in {s.files} Parquet files, {s.keys} keys, tumbling windows of "
        f"{s.window_ms / 1000:g} s, a count per key and window, no other per-record work; Overtake at parallelism "
        f"{s.parallelism} (the batch path's source reading {s.batch_rows:,} rows per batch), unaligned checkpoints "
        f"every {s.interval_ms} ms (embedded coordinator, SQLite). *Time*: "
        "Overtake from the first sink subtask's open to the last one's close (the sinks' clocks; Spark's job "
        "submission is outside it); PyFlink from the first event a map subtask handled to the last window's result "
        "(the JVM's start and the job's submission outside it); Spark Structured Streaming from `start()` to the end "
        "of `awaitTermination()`. "
        "*Per core*: records/s over min(task slots the job takes, CPUs). *Counted*: the sum of the windows' counts "
        "(equal to the events when none is lost or counted twice).\n",
        "| path | events | time | records/s | cores | records/s per core | windows | counted "
        "| checkpoints | unaligned p50 | sync phase p50 | persisted per checkpoint p50 | mean "
        "| stored per checkpoint p50 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in runs:
        x = r.summary()
        if not r.events:
            lines.append(f"| {r.label} | {r.note} |||||||||||||")
            continue
        cps = len(r.checkpoints_ms) if r.label != "Spark Structured Streaming" else None
        shown = _n(cps) + (f" (+{r.checkpoints_after} after)" if cps is not None and r.checkpoints_after else "")
        lines.append(
            f"| {r.label} | {r.events:,} | {r.seconds:,.1f} s | {_n(x['records_per_s'])} | {r.cores} "
            f"| {_n(x['records_per_s_per_core'])} | {r.windows:,} | {r.counted:,} | {shown} "
            f"| {_n(x['checkpoint_p50'], ' ms')} | {_n(x['sync_p50'], ' ms')} | {_bytes(x['persisted_p50'])} "
            f"| {_bytes(x['persisted_mean'])} "
            f"| {_bytes(x['stored_p50']) if cps is not None else '–'} |"
        )
    lines += [f"\n*{r.label}*: {r.note}." for r in runs if r.events and r.note]
    q = ratios(runs)

    def f(k: str) -> str:
        return "–" if q.get(k) is None else f"{q[k]:.1f}×"

    lines.append(f"\nBatch path per core: {f('batch_over_record')} the record path's, "
                 f"{f('batch_over_structured_streaming')} Spark Structured Streaming's, {f('batch_over_pyflink')} "
                 f"PyFlink's per record; the record path {f('record_over_pyflink')} PyFlink's. *Persisted*: the in-flight "
                 "bytes as they travelled; *stored*: the checkpoint's blobs (operator and channel state), "
                 "compressed on the rows that say a codec; *sync phase*: per checkpoint, the slowest subtask's "
                 "synchronous phase (its operator state's snapshot), which the end-to-end time includes. "
                 "Overtake's checkpoint figures are of the checkpoints triggered while the job read its input; "
                 "*+n after*: those triggered after its last windows fired, left out.")
    return "\n".join(lines) + "\n"


def write(s: Settings, runs: list[PathRun], out: Path, command: str = "", machine: str = "") -> str:
    data = {"settings": asdict(s), "runs": [r.summary() for r in runs], "ratios": ratios(runs)}
    return write_scenario(out, "batches", markdown(s, runs, command, machine), data)


def headline(runs: list[PathRun]) -> str:
    return ", ".join(f"{r.label} {_n(r.rate_per_core)} records/s per core" for r in runs if r.rate_per_core)


def standalone(s: Settings, out: Path, command: str, machine: str = "",
               status: Callable[[str], None] = lambda m: None) -> tuple[list[PathRun], str]:
    runs = run(s, status)
    return runs, write(s, runs, out, command, machine)


def main(argv: list[str] | None = None) -> int:
    d = Settings()
    p = argparse.ArgumentParser(prog="python -m benchmarks.batches", description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=None, help=f"events of the batch path (default {d.events:,})")
    p.add_argument("--record-events", type=int, default=None,
                   help=f"events of the record path (default {d.record_events:,}; 0: all)")
    p.add_argument("--files", type=int, default=d.files)
    p.add_argument("--window-ms", type=int, default=d.window_ms)
    p.add_argument("--batch-rows", type=int, default=d.batch_rows,
                   help=f"rows per batch the batch path's Parquet source reads (default {d.batch_rows:,})")
    p.add_argument("--interval-ms", type=int, default=d.interval_ms,
                   help=f"checkpoint interval of the Overtake paths and PyFlink (default {d.interval_ms})")
    p.add_argument("--quick", action="store_true", help="1 million events, the record path over 200,000")
    p.add_argument("--compression", nargs="+", default=d.compression, choices=["none", "lz4", "zstd"],
                   help="run the batch path once per codec, in this order, its channel state compressed with it "
                   "(none: uncompressed; default: none)")
    p.add_argument("--pyflink-events", type=int, default=None,
                   help=f"events of PyFlink's per-record run (default {d.pyflink_events:,}; 0: as many as the record path's)")
    p.add_argument("--batch-path-only", action="store_true",
                   help="no record path, no PyFlink, no Spark Structured Streaming")
    p.add_argument("--out", default="bench-results")
    p.add_argument("--structured-streaming-only", metavar="DIR", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    over = {k: v for k, v in (("events", a.events), ("record_events", a.record_events),
                              ("pyflink_events", a.pyflink_events)) if v is not None}
    over.update(files=a.files, window_ms=a.window_ms, compression=a.compression, batch_path_only=a.batch_path_only,
                batch_rows=a.batch_rows, interval_ms=a.interval_ms)
    s = Settings.quick_settings(**over) if a.quick else Settings(**over)
    if a.structured_streaming_only:
        from spark_plugin.driver.session import spark_session

        spark = spark_session(2, "overtake-bench-batches-ss", import_paths=[ROOT])
        r = measure_structured_streaming(spark, Path(a.structured_streaming_only), s.events, s)
        print(json.dumps(asdict(r)))
        return 0
    command = "python -m benchmarks.batches " + " ".join(argv if argv is not None else sys.argv[1:])
    _, text = standalone(s, Path(a.out), command.strip(), "", lambda m: print(m, file=sys.stderr))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
