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
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.flip76 import POLICIES, Runner, Settings, disk_bench, spark_tasks_needed
from benchmarks.report import BenchResults, machine_facts, write
from contract.units import human_bytes

SCENARIOS = {
    "checkpoints": "1. checkpoint duration under backpressure",
    "throughput-bp": "2. throughput under backpressure",
    "throughput": "3. throughput without backpressure",
    "disk": "4. channel-state write bandwidth",
    "acks": "5. coordinator ack throughput",
    "timers": "6. checkpoints while timers fire",
    "state": "7. state straight into the store vs. through the coordinator",
    "inflight": "8. in-flight bytes and recovery: fixed buffers vs. debloating",
    "adaptive": "9. the adaptive policy when backpressure comes and goes",
    "recovery-checkpoints": "10. the first checkpoint after a restore, with checkpoints during recovery or without",
    "incremental": "11. incremental channel state under sustained backpressure",
    "budget": "12. in-flight budget: duration and persisted bytes against the budget",
    "concurrent": "13. concurrent unaligned checkpoints: max_concurrent 1 against 2",
    "last-barrier": "14. last-barrier checkpoints: a flat_map with 100 outputs per input",
}
_ALIASES = {"1": "checkpoints", "2": "throughput-bp", "3": "throughput", "4": "disk", "5": "acks", "6": "timers",
            "7": "state", "8": "inflight", "9": "adaptive", "10": "recovery-checkpoints",
            "11": "incremental", "12": "budget", "13": "concurrent", "14": "last-barrier"}


class BenchUsageError(ValueError):
    """An option of ``overtake bench`` that cannot be used; the message says what to give instead."""


@dataclass
class BenchArgs:
    """What ``overtake bench`` was asked to run (its options are declared in ``cli.main``)."""

    chosen: list[str]
    quick: bool = False
    out: Path = Path("bench-results")
    postgres: str = Settings.pg_admin_url
    seconds: float | None = None
    depths: str | None = None
    policies: str | None = None

    def command(self) -> str:
        """The command line that asks for this run, for the report."""
        parts = ["overtake", "bench", *([] if self.chosen == list(SCENARIOS) else self.chosen)]
        if self.quick:
            parts.append("--quick")
        for flag, value in (("--seconds", self.seconds), ("--depths", self.depths), ("--policies", self.policies)):
            if value is not None:
                parts += [flag, str(value)]
        if self.out != Path("bench-results"):
            parts += ["--out", str(self.out)]
        return shlex.join(parts)


def bench_args(
    scenarios: list[str],
    quick: bool = False,
    out: Path = Path("bench-results"),
    postgres: str | None = None,
    seconds: float | None = None,
    depths: str | None = None,
    policies: str | None = None,
) -> BenchArgs:
    """Checked options of a run: scenario names or their numbers (none: all)."""
    chosen = []
    for s in scenarios:
        name = _ALIASES.get(s, s)
        if name not in SCENARIOS:
            raise BenchUsageError(
                f"unknown scenario {s!r}; choose from {', '.join(SCENARIOS)} (or their numbers: {', '.join(_ALIASES)})"
            )
        chosen.append(name)
    if policies:
        bad = [p for p in policies.split(",") if p.strip() not in POLICIES]
        if bad:
            raise BenchUsageError(f"unknown policy {bad[0]!r}; choose from {', '.join(POLICIES)}")
    if depths:
        try:
            tuple(int(d) for d in depths.split(","))
        except ValueError:
            raise BenchUsageError(f"--depths takes numbers separated by commas, e.g. 1,3; got {depths!r}") from None
    return BenchArgs(
        chosen=[s for s in SCENARIOS if s in chosen] if chosen else list(SCENARIOS),
        quick=quick,
        out=out,
        postgres=postgres or Settings.pg_admin_url,
        seconds=seconds,
        depths=depths,
        policies=policies,
    )


def settings_from(args: BenchArgs) -> Settings:
    over: dict[str, Any] = {"pg_admin_url": args.postgres}
    if args.seconds:
        over["backpressure_seconds"] = args.seconds
    if args.depths:
        over["depths"] = tuple(int(d) for d in args.depths.split(","))
    if args.policies:
        over["policies"] = tuple(p.strip() for p in args.policies.split(","))
    return Settings.quick_settings(**over) if args.quick else Settings(**over)


def inflight_settings_from(args: BenchArgs) -> Any:
    """Scenario 8's settings: ``--depths`` when given, ``--quick``."""
    from benchmarks import inflight

    over: dict[str, Any] = {}
    if args.depths:
        over["depths"] = tuple(int(d) for d in args.depths.split(","))
    return inflight.Settings.quick_settings(**over) if args.quick else inflight.Settings(**over)


def _adaptive_settings(args: BenchArgs) -> Any:
    from benchmarks.adaptive import WaveSettings

    w = WaveSettings.quick() if args.quick else WaveSettings()
    if args.seconds:
        w.seconds = args.seconds
    return w


def _incremental_settings(args: BenchArgs) -> Any:
    from benchmarks.incremental import IncrementalSettings

    w = IncrementalSettings.quick() if args.quick else IncrementalSettings()
    if args.seconds:
        w.seconds = args.seconds
    return w


def _adaptive_tasks(args: BenchArgs) -> int:
    if "adaptive" not in args.chosen:
        return 0
    from benchmarks.adaptive import tasks_needed

    return tasks_needed(_adaptive_settings(args))


def _recovery_checkpoint_tasks(args: BenchArgs) -> int:
    if "recovery-checkpoints" not in args.chosen:
        return 0
    from benchmarks.recovery_checkpoints import TASKS

    return TASKS


def budget_settings_from(args: BenchArgs) -> Any:
    """Scenario 12's settings: ``--depths`` and ``--seconds`` when given, ``--quick``."""
    from benchmarks import budget

    over: dict[str, Any] = {}
    if args.depths:
        over["depths"] = tuple(int(d) for d in args.depths.split(","))
    if args.seconds:
        over["seconds"] = args.seconds
    return budget.Settings.quick_settings(**over) if args.quick else budget.Settings(**over)


def concurrent_settings_from(args: BenchArgs) -> Any:
    """Scenario 13's settings: ``--seconds`` when given, ``--quick``."""
    from benchmarks import concurrent

    over: dict[str, Any] = {"seconds": args.seconds} if args.seconds else {}
    return concurrent.Settings.quick_settings(**over) if args.quick else concurrent.Settings(**over)


def last_barrier_settings_from(args: BenchArgs) -> Any:
    """Scenario 14's settings: ``--seconds`` when given, ``--quick``."""
    from benchmarks import last_barrier

    over: dict[str, Any] = {"seconds": args.seconds} if args.seconds else {}
    return last_barrier.Settings.quick_settings(**over) if args.quick else last_barrier.Settings(**over)


def _run_streamed(name: str, module_name: str, scenario_settings: Any, runner: Any, out: Path,
                  results: BenchResults, status: Any, done: Any) -> None:
    """A scenario whose module reports each run as it ends (``measure(runner, settings, each, into=runs)``): every
    run is shown and its report rewritten at once, so an interrupted benchmark keeps what it measured."""
    import importlib

    module = importlib.import_module(f"benchmarks.{module_name}")
    status("", SCENARIOS[name])
    machine = ", ".join(f"{k}: {v}" for k, v in results.machine.items())
    runs: list[Any] = []

    def each(x: Any) -> None:
        done(f"{x.label}: {module.headline(x)}")
        module.write(runs, scenario_settings, out, results.command, machine)

    module.measure(runner, scenario_settings, each, into=runs)


def _start_spark(tasks: int) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(f"local[{tasks}]").appName("overtake-bench")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(args: BenchArgs) -> int:
    """Runs ``overtake bench``; returns the exit code."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    s = settings_from(args)
    console = Console()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    results = BenchResults(settings=s, command=args.command(),
                           started=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    t0 = time.monotonic()
    load0 = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    chosen = args.chosen
    need_spark = any(c in chosen for c in ("checkpoints", "throughput-bp", "throughput", "state", "inflight",
                                           "adaptive", "incremental", "recovery-checkpoints", "budget",
                                           "concurrent", "last-barrier"))
    inflight_settings = inflight_settings_from(args)
    budget_settings = budget_settings_from(args)
    concurrent_settings = concurrent_settings_from(args)
    last_barrier_settings = last_barrier_settings_from(args)
    spark_tasks = max(spark_tasks_needed(s), inflight_settings.spark_tasks() if "inflight" in chosen else 0,
                      _adaptive_tasks(args), _recovery_checkpoint_tasks(args),
                      s.parallelism * (max(budget_settings.depths) + 1) if "budget" in chosen else 0,
                      s.parallelism * (concurrent_settings.depth + 1) if "concurrent" in chosen else 0,
                      last_barrier_settings.spark_tasks() if "last-barrier" in chosen else 0)
    runs_1 = [(p, d) for d in s.depths for p in s.policies] if "checkpoints" in chosen else []
    if "throughput-bp" in chosen and not runs_1:
        runs_1 = [(p, min(s.depths)) for p in s.policies]
    steps = len(runs_1) + (1 if "throughput-bp" in chosen else 0)
    steps += 2 * s.no_backpressure_repeats if "throughput" in chosen else 0
    steps += ("disk" in chosen) + ("acks" in chosen) + ("timers" in chosen) + ("state" in chosen)
    if "inflight" in chosen:
        from benchmarks import inflight

        steps += len(inflight_settings.depths) * len(inflight.sizings())
    steps += ("adaptive" in chosen) + ("incremental" in chosen) + ("recovery-checkpoints" in chosen)
    steps += len(budget_settings.runs()) if "budget" in chosen else 0
    steps += len(concurrent_settings.concurrency) if "concurrent" in chosen else 0
    steps += len(last_barrier_settings.policies) if "last-barrier" in chosen else 0
    steps += 2 if need_spark else 0
    steps += len(s.depths) if "checkpoints" in chosen else 0

    progress = Progress(SpinnerColumn(), TextColumn("[bold]{task.fields[scenario]}"), BarColumn(bar_width=24),
                        MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"),
                        console=console, transient=False)
    coordinator = None
    drop = None
    spark = None
    data_dir = Path(tempfile.mkdtemp(prefix=".bench-", dir=out))
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

        try:
            status("machine facts")
            if need_spark:
                status(f"starting Spark local[{spark_tasks}]")
                spark = _start_spark(spark_tasks)
                done("Spark started")
                from app.local import LocalCoordinator
                from benchmarks.acks import new_pg_database

                status("starting the coordinator on a fresh PostgreSQL database")
                db_url, drop = new_pg_database(s.pg_admin_url)
                coordinator = LocalCoordinator(
                    data_dir / "coordinator", {"OVERTAKE_DATABASE_URL": db_url, "OVERTAKE_LOG_LEVEL": "WARNING"}
                ).start()
                done(f"coordinator on PostgreSQL at {coordinator.url}")
            results.machine = machine_facts(spark, s.pg_admin_url)
            results.machine["load average at start"] = load0

            if "disk" in chosen:
                status("", SCENARIOS["disk"])
                results.disk = disk_bench(data_dir / "disk", s, status)
                d = results.disk
                done(f"disk: raw {d.raw:,.0f} MiB/s, channel state {d.channel_state:,.0f} MiB/s "
                     f"({d.ratio * 100:.0f}%)")

            runner = Runner(spark, coordinator.url, s, status, coordinator.proc.pid) if coordinator else None
            if runs_1:
                status("", SCENARIOS["checkpoints"] if "checkpoints" in chosen else SCENARIOS["throughput-bp"])
                for pol, d in runs_1:
                    x = runner.backpressured(pol, d)
                    results.backpressure.append(x)
                    p50, bound = x.p50_or_bound
                    p50_text = "none completed" if p50 is None else f"{'>' if bound else ''}{p50:,.0f} ms"
                    done(f"{x.label}: p50 {p50_text}, {x.completed} completed, "
                         f"{x.aborted} aborted, {x.unfinished} unfinished, {x.throughput:,.0f} records/s")
            if "checkpoints" in chosen:
                from benchmarks.ackpath import measure

                status("", "1. ack-path floor (no pipeline)")
                for d in s.depths:
                    n = s.parallelism * (d + 1)
                    un = results.run_of("unaligned", d)
                    per = int(un.persisted_avg / n) if un and un.persisted_avg else 256 << 10
                    status(f"{n} subtasks x (state into the store + ack | blobs + ack through the coordinator), "
                           f"{s.ack_path_rounds} checkpoints each")
                    a = measure(coordinator.url, n, s.ack_path_rounds, max(per, 1024))
                    results.ack_path.append(a)
                    done(f"ack path, {n} subtasks: all acked p50 {a.relay_p50:,.0f} ms direct through the host's relay, "
                         f"{a.direct_p50:,.0f} ms direct, {a.p50:,.0f} ms through the coordinator")
            if "throughput-bp" in chosen:
                status("", SCENARIOS["throughput-bp"])
                x = runner.backpressured(None, min(s.depths))
                results.no_checkpoints_backpressure = x
                done(f"no checkpoints, depth {x.depth}: {x.throughput:,.0f} records/s")
            if "throughput" in chosen:
                status("", SCENARIOS["throughput"])
                for _ in range(s.no_backpressure_repeats):
                    for pol in (None, "unaligned"):
                        x = runner.free(pol)
                        results.free.append(x)
                        done(f"{x.label}: {x.throughput:,.0f} records/s"
                             + (f", {x.completed} checkpoints completed" if pol else ""))
            if "inflight" in chosen:
                from benchmarks import inflight

                status("", SCENARIOS["inflight"])

                def inflight_done(x: Any) -> None:
                    done(f"{x.sizing}, depth {x.depth}: persisted {human_bytes(x.persisted_avg, '–')} per "
                         f"checkpoint (p50 {human_bytes(x.persisted_p50, '–')}), recovery "
                         f"{'–' if x.recovery_s is None else f'{x.recovery_s:.2f} s'}")

                results.inflight = inflight.InflightResult(settings={})
                measured = inflight.measure(spark, coordinator.url, inflight_settings, status, inflight_done,
                                            into=results.inflight)
                machine = ", ".join(f"{k}: {v}" for k, v in results.machine.items())
                inflight.write(measured, out, results.command, machine)
            if "adaptive" in chosen:
                from benchmarks import adaptive

                status("", SCENARIOS["adaptive"])
                w = _adaptive_settings(args)
                runs = adaptive.measure(runner, w, status)
                machine = ", ".join(f"{k}: {v}" for k, v in results.machine.items())
                adaptive.write(runs, w, out, results.command, machine)
                done(f"adaptive: {adaptive.summary(runs)}; report in {out / 'adaptive.md'}")
            if "incremental" in chosen:
                from benchmarks import incremental

                status("", SCENARIOS["incremental"])
                iw = _incremental_settings(args)
                runs = incremental.measure(runner, iw, status)
                machine = ", ".join(f"{k}: {v}" for k, v in results.machine.items())
                incremental.write(runs, iw, out, results.command, machine)
                done(f"incremental: {incremental.summary(runs)}; report in {out / 'incremental.md'}")
            if "recovery-checkpoints" in chosen:
                from benchmarks import recovery_checkpoints as rc

                status("", SCENARIOS["recovery-checkpoints"])
                rc_report = rc.measure(spark, coordinator.url, rc.RcSettings.quick() if args.quick else rc.RcSettings(),
                                       status)
                machine = ", ".join(f"{k}: {v}" for k, v in results.machine.items())
                path = rc.write(rc_report, out, results.command, machine)
                done(f"recovery checkpoints: {rc.summary(rc_report)}; report in {path}")
            streamed = (("budget", "budget", budget_settings), ("concurrent", "concurrent", concurrent_settings),
                        ("last-barrier", "last_barrier", last_barrier_settings))
            for name, module_name, scenario_settings in streamed:
                if name in chosen:
                    _run_streamed(name, module_name, scenario_settings, runner, out, results, status, done)
            if coordinator is not None:
                coordinator.stop()
                coordinator = None
            if "acks" in chosen:
                from benchmarks import acks

                status("", SCENARIOS["acks"])
                results.acks = acks.run(s.pg_admin_url, subtasks=s.ack_subtasks, checkpoints=s.ack_checkpoints,
                                        log=status)
                a = results.acks
                done(f"acks: {a.acks_per_s:,.0f} acks/s vs ceiling {a.ceiling_rps:,.0f} req/s "
                     f"({a.ratio * 100:.0f}%)")
                if shutil.which("wrk"):
                    from benchmarks import ack_ceiling

                    status("", "acks against the ceiling with wrk at 8, 32, 128 connections")
                    levels = ack_ceiling.run(s.pg_admin_url, [8, 32, 128], 3 if args.quick else 5,
                                             1 if args.quick else 3, log=status)
                    table = ack_ceiling.markdown(levels)
                    args.out.mkdir(parents=True, exist_ok=True)
                    (args.out / "ack-ceiling.md").write_text(
                        "## Durable acks against the no-database ceiling (wrk, PostgreSQL)\n\n" + table + "\n")
                    done("acks vs ceiling (wrk): " + ", ".join(f"{lv.connections}: {lv.ratio:.2f}" for lv in levels))
                else:
                    done("acks vs ceiling (wrk): skipped, wrk is not installed (apt-get install wrk)")
            if "timers" in chosen:
                from benchmarks import timers

                status("", SCENARIOS["timers"])
                t_settings = timers.Settings.quick() if args.quick else timers.Settings()
                if args.seconds:
                    t_settings.seconds = args.seconds
                timers.standalone(t_settings, out, results.command, status)
                done(f"timers: report in {out / 'timers.md'}")
            if "state" in chosen:
                from benchmarks import state_paths

                status("", SCENARIOS["state"])
                machine = ", ".join(f"{k}: {v}" for k, v in results.machine.items())
                sp = state_paths.measure(spark, s.pg_admin_url, s, status,
                                         large_seconds=10.0 if args.quick else 20.0,
                                         cpu_seconds=8.0 if args.quick else 20.0)
                state_paths.write(sp, out, results.command, machine)
                done(f"state paths: {state_paths.summary(sp)}; report in {out / 'state.md'}")
        except KeyboardInterrupt:
            results.errors["interrupted"] = "the run was interrupted; the report holds what was measured"
        except Exception as e:  # noqa: BLE001 - the report says what failed, with what was measured so far
            results.errors[progress.tasks[0].fields.get("scenario", "run")] = f"{type(e).__name__}: {e}"
            console.print_exception(max_frames=8)
        finally:
            if coordinator is not None:
                coordinator.stop()
            if drop is not None:
                try:
                    drop()
                except Exception as e:  # noqa: BLE001
                    console.print(f"[yellow]could not drop the benchmark database: {e}")
            if spark is not None:
                spark.stop()
            results.machine["load average at end"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
            results.seconds = time.monotonic() - t0
            path = write(results, out)
            shutil.rmtree(data_dir, ignore_errors=True)
    from rich.markdown import Markdown

    from benchmarks.report import targets

    console.rule("targets")
    tg = targets(results)
    console.print(Markdown("| target | measured | status | by how much |\n| --- | --- | --- | --- |\n"
                           + "\n".join(t.row() for t in tg)))
    console.print(f"report: {path} ({results.seconds / 60:.1f} min)")
    return 1 if results.errors else 0

