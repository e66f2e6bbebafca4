"""The scenarios of ``overtake bench``, in the order they run: each one's run, settings, steps and Spark slots."""

from __future__ import annotations

import importlib
import shutil
from typing import Any

from benchmarks import options
from benchmarks.disk import disk_bench
from benchmarks.flip76 import Settings
from benchmarks.options import SCENARIOS
from benchmarks.scaffold import Bench, Scenario
from contract.units import human_bytes


def _checkpoint_runs(b: Bench, name: str, runs: list[tuple[str, int]]) -> None:
    """Scenarios 1 and 2: backpressured runs of ``(policy, depth)``."""
    b.begin(name)
    for pol, d in runs:
        x = b.runner.backpressured(pol, d)
        b.results.backpressure.append(x)
        p50, bound = x.p50_or_bound
        p50_text = "none completed" if p50 is None else f"{'>' if bound else ''}{p50:,.0f} ms"
        b.done(f"{x.label}: p50 {p50_text}, {x.completed} completed, "
               f"{x.aborted} aborted, {x.unfinished} unfinished, {x.throughput:,.0f} records/s")


def _disk(b: Bench, _: Any) -> None:
    b.begin("disk")
    b.results.disk = d = disk_bench(b.data_dir / "disk", b.s, b.status)
    b.done(f"disk: raw {d.raw:,.0f} MiB/s, channel state {d.channel_state:,.0f} MiB/s ({d.ratio * 100:.0f}%)")


def _checkpoints(b: Bench, _: Any) -> None:
    from benchmarks.ackpath import measure

    s = b.s
    _checkpoint_runs(b, "checkpoints", [(p, d) for d in s.depths for p in s.policies])
    b.status("", "1. ack-path floor (no pipeline)")
    for d in s.depths:
        n = s.parallelism * (d + 1)
        un = b.results.run_of("unaligned", d)
        per = int(un.persisted_avg / n) if un and un.persisted_avg else 256 << 10
        b.status(f"{n} subtasks x (state into the store + ack | blobs + ack through the coordinator), "
                 f"{s.ack_path_rounds} checkpoints each")
        a = measure(b.url, n, s.ack_path_rounds, max(per, 1024))
        b.results.ack_path.append(a)
        b.done(f"ack path, {n} subtasks: all acked p50 {a.relay_p50:,.0f} ms direct through the host's relay, "
               f"{a.direct_p50:,.0f} ms direct, {a.p50:,.0f} ms through the coordinator")


def _throughput_bp(b: Bench, _: Any) -> None:
    if "checkpoints" not in b.args.chosen:  # scenario 1 ran these at every depth
        _checkpoint_runs(b, "throughput-bp", [(p, min(b.s.depths)) for p in b.s.policies])
    b.begin("throughput-bp")
    x = b.runner.backpressured(None, min(b.s.depths))
    b.results.no_checkpoints_backpressure = x
    b.done(f"no checkpoints, depth {x.depth}: {x.throughput:,.0f} records/s")


def _throughput(b: Bench, _: Any) -> None:
    b.begin("throughput")
    for _ in range(b.s.no_backpressure_repeats):
        for pol in (None, "unaligned"):
            x = b.runner.free(pol)
            b.results.free.append(x)
            b.done(f"{x.label}: {x.throughput:,.0f} records/s" + (f", {x.completed} checkpoints completed" if pol else ""))


def _inflight(b: Bench, settings: Any) -> None:
    from benchmarks import inflight

    b.begin("inflight")

    def each(x: Any) -> None:
        b.done(f"{x.sizing}, depth {x.depth}: persisted {human_bytes(x.persisted_avg, '–')} per "
               f"checkpoint (p50 {human_bytes(x.persisted_p50, '–')}), recovery "
               f"{'–' if x.recovery_s is None else f'{x.recovery_s:.2f} s'}")

    b.results.inflight = inflight.InflightResult(settings={})
    measured = inflight.measure(b.spark, b.url, settings, b.status, each, into=b.results.inflight)
    inflight.write(measured, b.out, b.results.command, b.machine())


def _reported(name: str, module_name: str, label: str, report: str) -> Any:
    """A scenario whose module measures with the runner, then writes its report: adaptive, incremental."""

    def run(b: Bench, settings: Any) -> None:
        module = importlib.import_module(f"benchmarks.{module_name}")
        b.begin(name)
        runs = module.measure(b.runner, settings, b.status)
        module.write(runs, settings, b.out, b.results.command, b.machine())
        b.done(f"{label}: {module.summary(runs)}; report in {b.out / report}")

    return run


def _recovery_checkpoints(b: Bench, settings: Any) -> None:
    from benchmarks import recovery_checkpoints as rc

    b.begin("recovery-checkpoints")
    report = rc.measure(b.spark, b.url, settings, b.status)
    path = rc.write(report, b.out, b.results.command, b.machine())
    b.done(f"recovery checkpoints: {rc.summary(report)}; report in {path}")


def _kill_restart(b: Bench, settings: Any) -> None:
    from benchmarks import kill_restart as kr

    b.begin("kill-restart")
    report = kr.measure(b.spark, b.url, settings, b.status)
    path = kr.write(report, b.out, b.results.command, b.machine())
    b.done(f"kill to running: {kr.summary(report)}; report in {path}")


def _streamed(name: str, module_name: str) -> Any:
    return lambda b, settings: b.streamed(name, module_name, settings)


def _acks(b: Bench, _: Any) -> None:
    from benchmarks import acks

    s, quick = b.s, b.args.quick
    b.begin("acks")
    b.results.acks = a = acks.run(s.pg_admin_url, subtasks=s.ack_subtasks, checkpoints=s.ack_checkpoints, log=b.status)
    b.done(f"acks: {a.acks_per_s:,.0f} acks/s vs ceiling {a.ceiling_rps:,.0f} req/s ({a.ratio * 100:.0f}%)")
    if not shutil.which("wrk"):
        b.done("acks vs ceiling (wrk): skipped, wrk is not installed (apt-get install wrk)")
        return
    from benchmarks import ack_ceiling

    b.status("", "acks against the ceiling with wrk at 8, 32, 128 connections")
    levels = ack_ceiling.run(s.pg_admin_url, [8, 32, 128], 3 if quick else 5, 1 if quick else 3, log=b.status)
    b.out.mkdir(parents=True, exist_ok=True)
    (b.out / "ack-ceiling.md").write_text(
        "## Durable acks against the no-database ceiling (wrk, PostgreSQL)\n\n" + ack_ceiling.markdown(levels) + "\n")
    b.done("acks vs ceiling (wrk): " + ", ".join(f"{lv.connections}: {lv.ratio:.2f}" for lv in levels))


def _timers(b: Bench, settings: Any) -> None:
    from benchmarks import timers

    b.begin("timers")
    timers.standalone(settings, b.out, b.results.command, b.status)
    b.done(f"timers: report in {b.out / 'timers.md'}")


def _kafka(b: Bench, settings: Any) -> None:
    from benchmarks import kafka

    b.begin("kafka")
    kafka.standalone(settings, b.out, b.results.command, b.machine(), b.status,
                     lambda v: b.done(f"{v.label}: {kafka.headline(v)}"))


def _triggers(b: Bench, settings: Any) -> None:
    from benchmarks import trigger_spacing

    b.begin("triggers")
    runs = trigger_spacing.run(settings, b.status)
    path = trigger_spacing.write(settings, runs, b.out, b.results.command, b.machine())
    b.done(f"trigger spacing: {trigger_spacing.headline(runs)}; report in {path}")


def _batches(b: Bench, settings: Any) -> None:
    from benchmarks import batches

    b.begin("batches")
    runs, _ = batches.standalone(settings, b.out, b.results.command, b.machine(), b.status)
    b.done(f"batches: {batches.headline(runs)}; report in {b.out / 'batches.md'}")


def _state(b: Bench, _: Any) -> None:
    from benchmarks import state_paths

    b.begin("state")
    machine = b.machine()
    quick = b.args.quick
    sp = state_paths.measure(b.spark, b.s.pg_admin_url, b.s, b.status, large_seconds=10.0 if quick else 20.0,
                             cpu_seconds=8.0 if quick else 20.0)
    state_paths.write(sp, b.out, b.results.command, machine)
    b.done(f"state paths: {state_paths.summary(sp)}; report in {b.out / 'state.md'}")


def _inflight_steps(w: Any, s: Settings, chosen: list[str]) -> int:
    from benchmarks import inflight

    return len(w.depths) * len(inflight.sizings())


def _adaptive_tasks(w: Any, s: Settings) -> int:
    from benchmarks.adaptive import tasks_needed

    return tasks_needed(w)


def _recovery_checkpoint_tasks(w: Any, s: Settings) -> int:
    from benchmarks.recovery_checkpoints import TASKS

    return TASKS


#: every scenario, in the order a run takes them (``SCENARIOS`` lists them by number)
REGISTRY: tuple[Scenario, ...] = (
    Scenario("disk", _disk),
    Scenario("checkpoints", _checkpoints, spark=True,
             steps=lambda w, s, chosen: len(s.depths) * len(s.policies) + len(s.depths)),
    Scenario("throughput-bp", _throughput_bp, spark=True,
             steps=lambda w, s, chosen: 1 + (0 if "checkpoints" in chosen else len(s.policies))),
    Scenario("throughput", _throughput, spark=True, steps=lambda w, s, chosen: 2 * s.no_backpressure_repeats),
    Scenario("inflight", _inflight, options.inflight_settings_from, _inflight_steps,
             lambda w, s: w.spark_tasks(), spark=True),
    Scenario("adaptive", _reported("adaptive", "adaptive", "adaptive", "adaptive.md"),
             options.adaptive_settings_from, tasks=_adaptive_tasks, spark=True),
    Scenario("incremental", _reported("incremental", "incremental", "incremental", "incremental.md"),
             options.incremental_settings_from, spark=True),
    Scenario("recovery-checkpoints", _recovery_checkpoints, options.recovery_checkpoints_settings_from,
             tasks=_recovery_checkpoint_tasks, spark=True),
    Scenario("kill-restart", _kill_restart, options.kill_restart_settings_from,
             tasks=lambda w, s: 4, spark=True),
    Scenario("budget", _streamed("budget", "budget"), options.budget_settings_from,
             lambda w, s, chosen: len(w.runs()), lambda w, s: s.parallelism * (max(w.depths) + 1), spark=True),
    Scenario("concurrent", _streamed("concurrent", "concurrent"), options.concurrent_settings_from,
             lambda w, s, chosen: len(w.concurrency), lambda w, s: s.parallelism * (w.depth + 1), spark=True),
    Scenario("last-barrier", _streamed("last-barrier", "last_barrier"), options.last_barrier_settings_from,
             lambda w, s, chosen: len(w.policies), lambda w, s: w.spark_tasks(), spark=True),
    Scenario("acks", _acks, alone=True),
    Scenario("timers", _timers, options.timers_settings_from, alone=True),
    Scenario("kafka", _kafka, options.kafka_settings_from, lambda w, s, chosen: len(w.variants), alone=True),
    Scenario("triggers", _triggers, options.triggers_settings_from, alone=True),
    Scenario("batches", _batches, options.batches_settings_from, alone=True),
    Scenario("state", _state, spark=True, alone=True),
)
assert sorted(sc.name for sc in REGISTRY) == sorted(SCENARIOS), "every scenario of overtake bench is in the registry"
