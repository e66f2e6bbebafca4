"""Run the FLIP-76 test plan on local Spark with the coordinator on PostgreSQL; write a markdown report and PNG
plots into the results folder.

Scenarios (default: all):
  checkpoints   1. checkpoint duration under sustained backpressure, per policy and shuffle depth
  throughput-bp 2. throughput under backpressure, each policy against no checkpoints
  throughput    3. throughput without backpressure, unaligned every second against no checkpoints
  disk          4. channel-state write bandwidth against raw sequential write bandwidth
  acks          5. coordinator ack throughput against its no-database ceiling
  timers        6. unaligned checkpoint duration while bursts of event-time timers fire, against no timers
                   (its own report: timers.md; benchmarks/timers.py)
  state         7. state straight into the blob store against state through the coordinator (state.md;
                   benchmarks/state_paths.py)
  inflight      8. persisted in-flight bytes per unaligned checkpoint and recovery time under backpressure, fixed
                   buffers against buffer debloating to 1 s and 0.1 s, depths 1 and 2 (inflight.md, and a section
                   of report.md; benchmarks/inflight.py)
  adaptive      9. the adaptive policy against the fixed ones when backpressure comes and goes (adaptive.md)
  recovery-checkpoints
               10. time to the first completed checkpoint after a restore with large in-flight state, with and
                   without checkpoints during recovery (recovery-checkpoints.md; benchmarks/recovery_checkpoints.py)
  incremental  11. bytes written per checkpoint under sustained backpressure, incremental channel state off and on
                   (incremental.md; benchmarks/incremental.py)
  budget       12. checkpoint duration and persisted in-flight bytes of unaligned checkpoints without a budget and
                   with in-flight budgets of 64 KiB and 256 KiB per subtask, depths 1 and 2 (budget.md;
                   benchmarks/budget.py)
  concurrent   13. concurrent unaligned checkpoints: max_concurrent 1 against 2 with a 20 ms interval under
                   backpressure: checkpoints completed per minute, duration p50, aborted (concurrent.md;
                   benchmarks/concurrent.py)
  last-barrier 14. persisted bytes (input and output side) and duration of a flat_map with 100 outputs per input,
                   first-barrier unaligned against last-barrier and aligned (last-barrier.md; benchmarks/last_barrier.py)
  kafka        15. Kafka end to end: latency from produce time to a read_committed reader, p50 and p99, through
                   KafkaSource, a slow keyed stage and KafkaSink under backpressure at a 1 s interval; unaligned
                   and aligned exactly-once, unaligned at-least-once (kafka.md; benchmarks/kafka.py; starts Tansu)

``overtake bench soak --cases N`` runs the randomized rescale soak instead (alone, no Spark; benchmarks/soak.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.flip76 import Runner, spark_tasks_needed
from benchmarks.options import SCENARIOS, BenchArgs, BenchUsageError, bench_args, settings_from
from benchmarks.report import write
from benchmarks.results import BenchResults, machine_facts
from benchmarks.scaffold import Bench
from benchmarks.scenarios import REGISTRY
from benchmarks.targets import targets

__all__ = ["SCENARIOS", "BenchArgs", "BenchUsageError", "bench_args", "main"]


def _start_spark(tasks: int) -> Any:
    from spark_plugin.driver.session import spark_session

    return spark_session(tasks, "overtake-bench")


def _start_coordinator(b: Bench) -> None:
    """The shared coordinator, on a fresh PostgreSQL database that ``b.drop`` drops."""
    from app.local import LocalCoordinator
    from benchmarks.acks import new_pg_database

    b.status("starting the coordinator on a fresh PostgreSQL database")
    db_url, b.drop = new_pg_database(b.s.pg_admin_url)
    b.coordinator = LocalCoordinator(
        b.data_dir / "coordinator", {"OVERTAKE_DATABASE_URL": db_url, "OVERTAKE_LOG_LEVEL": "WARNING"}
    ).start()
    b.done(f"coordinator on PostgreSQL at {b.coordinator.url}")


def _progress(console: Any) -> Any:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(SpinnerColumn(), TextColumn("[bold]{task.fields[scenario]}"), BarColumn(bar_width=24),
                    MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"),
                    console=console, transient=False)


def _tear_down(b: Bench, console: Any) -> None:
    if b.coordinator is not None:
        b.coordinator.stop()
    if b.drop is not None:
        try:
            b.drop()
        except Exception as e:  # noqa: BLE001
            console.print(f"[yellow]could not drop the benchmark database: {e}")
    if b.spark is not None:
        b.spark.stop()


def main(args: BenchArgs) -> int:
    """Runs ``overtake bench``; returns the exit code."""
    from rich.console import Console
    from rich.markdown import Markdown

    s = settings_from(args)
    console = Console()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    results = BenchResults(settings=s, command=args.command(),
                           started=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    t0 = time.monotonic()
    load0 = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    chosen = [sc for sc in REGISTRY if sc.name in args.chosen]
    settings = {sc.name: sc.settings(args) for sc in chosen}
    need_spark = any(sc.spark for sc in chosen)
    spark_tasks = max([spark_tasks_needed(s)] + [sc.tasks(settings[sc.name], s) for sc in chosen])
    steps = sum(sc.steps(settings[sc.name], s, args.chosen) for sc in chosen) + (2 if need_spark else 0)
    progress = _progress(console)
    with progress:
        task = progress.add_task("", total=steps, scenario="setup")

        def status(msg: str, scenario: str | None = None) -> None:
            if scenario is not None:
                progress.update(task, scenario=scenario)
            progress.update(task, description=msg)

        def done(msg: str) -> None:
            progress.advance(task)
            progress.console.print(f"  [green]✓[/] {msg}")
            write(results, out)

        b = Bench(args, s, results, out, Path(tempfile.mkdtemp(prefix=".bench-", dir=out)), status, done)
        try:
            status("machine facts")
            if need_spark:
                status(f"starting Spark local[{spark_tasks}]")
                b.spark = _start_spark(spark_tasks)
                done("Spark started")
                _start_coordinator(b)
                b.runner = Runner(b.spark, b.coordinator.url, s, status, b.coordinator.proc.pid)
            results.machine = machine_facts(b.spark, s.pg_admin_url)
            results.machine["load average at start"] = load0
            for sc in chosen:
                if sc.alone and b.coordinator is not None:
                    b.coordinator.stop()
                    b.coordinator = None
                sc.run(b, settings[sc.name])
        except KeyboardInterrupt:
            results.errors["interrupted"] = "the run was interrupted; the report holds what was measured"
        except Exception as e:  # noqa: BLE001 - the report says what failed, with what was measured so far
            results.errors[progress.tasks[0].fields.get("scenario", "run")] = f"{type(e).__name__}: {e}"
            console.print_exception(max_frames=8)
        finally:
            _tear_down(b, console)
            results.machine["load average at end"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
            results.seconds = time.monotonic() - t0
            path = write(results, out)
            shutil.rmtree(b.data_dir, ignore_errors=True)
    console.rule("targets")
    console.print(Markdown("| target | measured | status | by how much |\n| --- | --- | --- | --- |\n"
                           + "\n".join(t.row() for t in targets(results))))
    console.print(f"report: {path} ({results.seconds / 60:.1f} min)")
    return 1 if results.errors else 0
