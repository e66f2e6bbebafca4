"""The options of ``overtake bench``: the scenarios by name and number, the checked arguments of a run, and each
scenario's settings from them."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.flip76 import POLICIES, Settings

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
    "kafka": "15. Kafka end to end: produce to read_committed, exactly-once and at-least-once",
    "triggers": "16. trigger spacing: periodic checkpoints at 10 to 200 ms intervals",
    "batches": "17. batches against records: a keyed tumbling-window count, batch path, record path, Spark",
    "kill-restart": "18. kill to running: from a killed subtask to the job running again, and its phases",
}
_ALIASES = {"1": "checkpoints", "2": "throughput-bp", "3": "throughput", "4": "disk", "5": "acks", "6": "timers",
            "7": "state", "8": "inflight", "9": "adaptive", "10": "recovery-checkpoints",
            "11": "incremental", "12": "budget", "13": "concurrent", "14": "last-barrier",
            "15": "kafka", "16": "triggers", "17": "batches", "18": "kill-restart"}


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

    def depth_tuple(self) -> tuple[int, ...]:
        """``--depths`` as numbers (checked by ``bench_args``)."""
        return tuple(int(d) for d in (self.depths or "").split(","))

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
        over["depths"] = args.depth_tuple()
    if args.policies:
        over["policies"] = tuple(p.strip() for p in args.policies.split(","))
    return Settings.quick_settings(**over) if args.quick else Settings(**over)


def inflight_settings_from(args: BenchArgs) -> Any:
    """Scenario 8's settings: ``--depths`` when given, ``--quick``."""
    from benchmarks import inflight

    over: dict[str, Any] = {}
    if args.depths:
        over["depths"] = args.depth_tuple()
    return inflight.Settings.quick_settings(**over) if args.quick else inflight.Settings(**over)


def adaptive_settings_from(args: BenchArgs) -> Any:
    """Scenario 9's settings: ``--seconds`` (per policy run) when given, ``--quick``."""
    from benchmarks.adaptive import WaveSettings

    w = WaveSettings.quick() if args.quick else WaveSettings()
    if args.seconds:
        w.seconds = args.seconds
    return w


def incremental_settings_from(args: BenchArgs) -> Any:
    """Scenario 11's settings: ``--seconds`` when given, ``--quick``."""
    from benchmarks.incremental import IncrementalSettings

    w = IncrementalSettings.quick() if args.quick else IncrementalSettings()
    if args.seconds:
        w.seconds = args.seconds
    return w


def recovery_checkpoints_settings_from(args: BenchArgs) -> Any:
    """Scenario 10's settings: ``--quick``."""
    from benchmarks.recovery_checkpoints import RcSettings

    return RcSettings.quick() if args.quick else RcSettings()


def kill_restart_settings_from(args: BenchArgs) -> Any:
    """Scenario 18's settings: ``--quick`` (3 kills)."""
    from benchmarks.kill_restart import KrSettings

    return KrSettings.quick() if args.quick else KrSettings()


def timers_settings_from(args: BenchArgs) -> Any:
    """Scenario 6's settings: ``--seconds`` when given, ``--quick``."""
    from benchmarks import timers

    t = timers.Settings.quick() if args.quick else timers.Settings()
    if args.seconds:
        t.seconds = args.seconds
    return t


def budget_settings_from(args: BenchArgs) -> Any:
    """Scenario 12's settings: ``--depths`` and ``--seconds`` when given, ``--quick``."""
    from benchmarks import budget

    over: dict[str, Any] = {}
    if args.depths:
        over["depths"] = args.depth_tuple()
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


def kafka_settings_from(args: BenchArgs) -> Any:
    """Scenario 15's settings: ``--seconds`` (producing time per variant) when given, ``--quick``."""
    from benchmarks import kafka

    over: dict[str, Any] = {"seconds": args.seconds} if args.seconds else {}
    return kafka.Settings.quick_settings(**over) if args.quick else kafka.Settings(**over)


def triggers_settings_from(args: BenchArgs) -> Any:
    """Scenario 16's settings: ``--seconds`` per interval when given (6 s; 3 s with ``--quick``); the coordinator on
    the run's PostgreSQL."""
    from benchmarks import trigger_spacing

    seconds = args.seconds or (3.0 if args.quick else 6.0)
    return trigger_spacing.Settings(seconds=seconds, pg_admin_url=args.postgres)


def batches_settings_from(args: BenchArgs) -> Any:
    """Scenario 17's settings: 30 million events in 30 files (1 million with ``--quick``)."""
    from benchmarks import batches

    return batches.Settings.quick_settings() if args.quick else batches.Settings()
