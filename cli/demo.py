"""``overtake demo``: a backpressured pipeline on local Spark, checkpointed unaligned and then aligned, side by side.

Starts the coordinator on its embedded defaults (SQLite and blobs in ``--data-dir``, in-process event bus) as a
subprocess (``app.local.LocalCoordinator``) unless ``--coordinator URL`` is given, and prints its UI's address at once;
runs a pipeline whose keyed stage spends ``--record-cost`` milliseconds per record so that backpressure builds, takes a
checkpoint every second, shows a live table of the checkpoints, and prints a summary of both runs. Then, in a
terminal, it keeps the coordinator running so the UI shows what ran, until Ctrl-C; either way it says how to open
the same data later (the data directory is kept).
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cli.format import human_bytes
from spark_plugin import Pipeline
from spark_plugin.connectors import DiscardSink, SequenceSource
from spark_plugin.network.config import NetworkConfig


def slow_count(cost_s: float):
    """A keyed process function that spends ``cost_s`` seconds per record and counts records per key."""

    def process(key, record, state):
        time.sleep(cost_s)
        state.update((state.value() or 0) + 1)
        return [(key, record[1])]

    return process


def build_pipeline(name: str, parallelism: int, cost_ms: float, payload: int, keys: int, skew: float) -> Pipeline:
    """The demo pipeline: sequence source -> parse -> key_by -> slow keyed count -> discarding sink."""
    p = Pipeline(name, parallelism=parallelism)
    (
        p.source(SequenceSource(keys=keys, skew=skew, payload=payload), id="source")
        .map(lambda r: r, id="parse")
        .key_by(lambda r: r[0])
        .process(slow_count(cost_ms / 1000.0), id="slow-count")
        .sink(DiscardSink(), id="sink")
    )
    return p


def _fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f} ms"


def checkpoint_table(title: str, checkpoints: list) -> Any:
    from rich.table import Table

    from cli.format import checkpoint_status

    t = Table(title=title, expand=False)
    for col in ("id", "type", "status", "end-to-end", "persisted in-flight", "alignment", "acks"):
        t.add_column(col, justify="right" if col not in ("type", "status") else "left", no_wrap=True)
    for c in sorted(checkpoints, key=lambda c: c.id)[-15:]:
        t.add_row(
            str(c.id), c.checkpoint_type.value, checkpoint_status(c), _fmt_ms(c.end_to_end_duration),
            human_bytes(c.persisted_data), _fmt_ms(c.alignment_duration),
            f"{c.num_acknowledged_subtasks}/{c.num_subtasks}",
        )
    return t


def summarize(checkpoints: list, records: int, seconds: float) -> dict[str, Any]:
    """Statistics of a run's checkpoints after warm-up.

    The checkpoints triggered before the first one completed are left out: they waited for the Spark tasks to
    start, which says nothing about barriers. Checkpoints still pending when the run ended are counted apart.
    """
    ordered = sorted(checkpoints, key=lambda c: c.id)
    first_done = next((c.id for c in ordered if c.status.value == "COMPLETED"), None)
    steady = [c for c in ordered if first_done is not None and c.id > first_done]
    aborted = [c for c in steady if c.status.value == "ABORTED"]
    failed = [c for c in aborted if c.abort_reason in ("expired", "declined")]
    done = [c for c in steady if c.status.value == "COMPLETED"]
    durations = sorted(c.end_to_end_duration for c in done if c.end_to_end_duration is not None)
    return {
        "checkpoints after warm-up": len(steady),
        "completed": len(done),
        # the words of the UI, the API and `overtake checkpoints stats`
        "failed": len(failed),
        "not finished": len(aborted) - len(failed),
        "in progress": sum(1 for c in steady if c.status.value == "PENDING"),
        "median end-to-end": statistics.median(durations) if durations else None,
        "p90 end-to-end": durations[int(0.9 * (len(durations) - 1))] if durations else None,
        "max end-to-end": durations[-1] if durations else None,
        "avg persisted in-flight": statistics.mean(c.persisted_data for c in done) if done else None,
        "max alignment": max((c.alignment_duration or 0 for c in done), default=None),
        "records/s (slow stage)": records / seconds if seconds else 0,
    }


@dataclass
class DemoOptions:
    """The options of ``overtake demo`` (declared with their help in ``cli.main``)."""

    coordinator: str | None = None
    data_dir: Path = Path(".overtake/demo")
    port: int = 8321
    duration: float = 30.0
    interval: int = 1000
    parallelism: int = 2
    record_cost: float = 1.0
    payload: int = 100
    keys: int = 64
    skew: float = 0.8
    buffer_size: int = 32 * 1024
    debloat_target: float | None = None
    only: str | None = None
    event_time: bool = True
    wait: bool = False


def run_phase(args: DemoOptions, spark: Any, url: str, policy: str, console: Any) -> dict[str, Any]:
    from rich.live import Live

    from client.sync import OvertakeClient
    from contract.models import CheckpointConfig

    name = f"demo-{policy}-{int(time.time())}"
    pipeline = build_pipeline(name, args.parallelism, args.record_cost, args.payload, args.keys, args.skew)
    config = CheckpointConfig(interval=args.interval, policy=policy, timeout=max(60_000, args.duration * 2000),
                              retained=3)
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = pipeline.run(
                spark, url, checkpoint=config, time_limit=args.duration,
                network=NetworkConfig(buffer_size=args.buffer_size, debloat_target_s=args.debloat_target),
            )
        except BaseException as e:  # noqa: BLE001 - reported below
            outcome["error"] = e

    runner = threading.Thread(target=target, name=f"demo {policy}", daemon=True)
    runner.start()
    client = OvertakeClient(url)
    checkpoints: list = []
    job_id = None
    title = f"{policy} checkpoints every {args.interval} ms, {args.record_cost} ms per record in the keyed stage"
    with Live(checkpoint_table(title, []), console=console, refresh_per_second=4, transient=False) as live:
        while runner.is_alive():
            if job_id is None:
                jobs = [j for j in client.list_jobs(limit=20).items if j.name == name]
                job_id = jobs[0].id if jobs else None
                if job_id is not None:
                    live.console.print(f"job {job_id} in the UI: {url}/#/jobs/{job_id}")
            if job_id is not None:
                checkpoints = client.list_checkpoints(job_id, limit=1000).items
                live.update(checkpoint_table(title, checkpoints))
            runner.join(0.5)
        if job_id is not None:
            checkpoints = client.list_checkpoints(job_id, limit=1000).items
            live.update(checkpoint_table(title, checkpoints))
    client.close()
    if "error" in outcome:
        raise outcome["error"]
    result = outcome["result"]
    records = sum(s.records_in for s in result.subtasks if s.vertex == "slow-count")
    return summarize(checkpoints, records, args.duration)


def summary_table(results: dict[str, dict[str, Any]]) -> Any:
    """One column per policy run, one row per statistic."""
    from rich.table import Table

    t = Table(title="same pipeline, same backpressure: " + " vs ".join(results))
    t.add_column("")
    for policy in results:
        t.add_column(policy, justify="right")
    first = next(iter(results.values()))
    for key in first:
        cells = []
        for summary in results.values():
            v = summary[key]
            if "end-to-end" in key or "alignment" in key:
                cells.append(_fmt_ms(v))
            elif "persisted" in key:
                cells.append(human_bytes(v))
            elif isinstance(v, float):
                cells.append(f"{v:,.0f}")
            else:
                cells.append(str(v))
        t.add_row(key, *cells)
    return t


def _port(preferred: int) -> int:
    """``preferred`` when it is free on 127.0.0.1, else any free port. The probe binds as the coordinator's server
    does (with SO_REUSEADDR, as uvicorn sets it): a port whose last server stopped moments ago, with its connections
    still in TIME_WAIT, is free for a new server, and the demo takes it."""
    import socket

    from app.local import free_port

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            return free_port()


def run(args: DemoOptions) -> int:
    """Runs ``overtake demo``; returns the exit code."""
    from rich.console import Console

    console = Console()
    coordinator = None
    url = args.coordinator
    if url is None:
        from app.local import LocalCoordinator

        data_dir = args.data_dir.resolve()
        console.print(f"starting the coordinator (embedded defaults, data in {data_dir}) ...")
        coordinator = LocalCoordinator(
            data_dir, {"OVERTAKE_LOG_LEVEL": "WARNING", "OVERTAKE_LOG_FORMAT": "text"}, port=_port(args.port)
        ).start()
        url = coordinator.url
    console.print(f"[bold]the UI: {url}/[/bold] (open it now: the demo's jobs appear there as they run)")
    from cli.demo_event_time import run_scenario, tasks_needed

    tasks = max(2 * args.parallelism, tasks_needed(1) if args.event_time else 0)
    try:
        from pyspark.sql import SparkSession

        from spark_plugin.driver.session import spark_session

        own_spark = SparkSession.getActiveSession() is None
        console.print(f"starting Spark local[{tasks}] ..." if own_spark else "using the active Spark session ...")
        spark = spark_session(tasks, "overtake-demo")
        results = {}
        for policy in ("unaligned", "aligned"):
            if args.only and policy != args.only:
                continue
            console.rule(f"{policy} checkpoints")
            results[policy] = run_phase(args, spark, url, policy, console)
            console.print()
        if results:
            console.print(summary_table(results))
            console.print("warm-up (the checkpoints up to the first completed one, which waited for Spark to "
                          "start the tasks) is not counted; a checkpoint still pending when a run ended is shown as "
                          "NOT FINISHED, not as a failure")
        if args.event_time:
            console.rule("event time: windows, watermarks, late records")
            run_scenario(spark, url, console)
        if own_spark:
            spark.stop()
        if coordinator is not None:
            _linger(console, url, args)
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        if coordinator is not None:
            coordinator.stop()


def later_command(data_dir: Path) -> str:
    """The command that serves a demo's data again, from the project's directory of a fresh clone: through
    ``dev.sh``, which sets up and uses the project's virtualenv (``overtake`` itself is on no PATH there)."""
    return f"./dev.sh serve --data-dir {data_dir}"


def _linger(console: Any, url: str, args: DemoOptions) -> None:
    """Keep the embedded coordinator up for the UI until Ctrl-C (in a terminal), and say how to come back later."""
    later = later_command(args.data_dir)
    if not args.wait:
        console.print(f"to look at this run in the UI later: {later} (then {url.rsplit(':', 1)[0]}:8321/)")
        return
    console.print(f"[bold]the UI keeps showing this run at {url}/ ; press Ctrl-C to stop[/bold]")
    console.print(f"(later, the same data: {later})")
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        console.print("stopped")
