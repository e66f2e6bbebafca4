"""Scenario 10: time to the first completed checkpoint after a restore with large in-flight state, with and without
checkpoints during recovery (``NetworkConfig.checkpoints_during_recovery``), in one run.

    python -m benchmarks.recovery_checkpoints [--quick] [--out bench-results]     (or: overtake bench recovery-checkpoints)

A keyed counter behind two unbounded sources, slow in its keyed stage (backpressure) and with many network buffers
per channel, runs unaligned until it completed a few checkpoints; then the same checkpoint is restored twice, once
with each setting: without checkpoints during recovery until its first checkpoint completed (after the replay), with
them for as long as the replay took without them and a few seconds more. Measured per setting: from
submitting the attempt (Spark stage start included) until its first checkpoint completed, and until the keyed stage
processed the last restored in-flight record (the end of the replay), with the in-flight data restored and the
bytes that first checkpoint persisted. Until a checkpoint completes, a second failure starts over from the one
restored.

Writes ``recovery-checkpoints.md`` (and ``.json``) into ``--out``. Needs Java 17+ for local Spark; standalone it
runs the coordinator embedded (SQLite) in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TASKS = 4
"""Spark task slots the scenario needs: two source chains and two keyed-stage chains."""


@dataclass
class RcSettings:
    delay: float = 0.0005
    """Seconds per record in the keyed stage."""
    buffers: tuple[int, int, int] = (4, 16, 20)
    """Exclusive buffers per channel, floating per gate, max per output channel (32 KiB each)."""
    checkpoints_before: int = 3
    """Checkpoints the first run completes before it stops (the last one is restored)."""
    interval: int = 500
    tail: float = 10.0
    """Seconds a restored run with checkpoints during recovery runs beyond the replay time measured without."""

    @classmethod
    def quick(cls) -> RcSettings:
        return cls(delay=0.0003, buffers=(2, 8, 10), checkpoints_before=2, tail=5.0)


@dataclass
class Restored:
    """One restored attempt."""

    during_recovery: bool
    restored_bytes: int
    replayed_records: int
    first_checkpoint_s: float | None
    """From submitting the attempt until its first checkpoint completed (None: none completed)."""
    replay_s: float | None
    """From submitting the attempt until the keyed stage processed the last restored in-flight record."""
    first_checkpoint_persisted: int = 0


@dataclass
class RcReport:
    settings: dict = field(default_factory=dict)
    runs: list[Restored] = field(default_factory=list)


# ---------------------------------------------------------------------------------------- arithmetic (no Spark)


def first_completed(checkpoints: Iterable[Any], attempt: int) -> Any | None:
    """The attempt's first completed checkpoint (by completion time), or None."""
    done = [c for c in checkpoints if c.attempt == attempt and _status(c) == "COMPLETED" and not c.is_savepoint
            and c.end_to_end_duration is not None]
    return min(done, key=lambda c: c.trigger_timestamp + c.end_to_end_duration, default=None)


def _status(c: Any) -> str:
    return getattr(c.status, "value", c.status)


def seconds_to_first_checkpoint(checkpoints: Iterable[Any], attempt: int, submitted: float) -> float | None:
    """Seconds from ``submitted`` (epoch seconds) until the attempt's first checkpoint completed."""
    first = first_completed(checkpoints, attempt)
    if first is None:
        return None
    return (first.trigger_timestamp + first.end_to_end_duration) / 1000 - submitted


def replay_end(outputs: list[tuple], emitted: dict[int, int], submitted: float) -> tuple[int, float | None]:
    """How many output records were restored in-flight data, and seconds from ``submitted`` until the last of them
    was processed. A record ``(key, seq, n, stamp)`` was in flight when its source split (``seq % 2``) had emitted
    it by the checkpoint (``seq // 2 < emitted[split]``)."""
    replayed = [r for r in outputs if r[1] // 2 < emitted.get(r[1] % 2, 0)]
    if not replayed:
        return 0, None
    return len(replayed), max(r[3] for r in replayed) - submitted


def markdown(report: RcReport, command: str, machine: str = "") -> str:
    s = report.settings
    lines = [
        "# Checkpoints during recovery",
        "",
        f"`{command}`" + (f" — {machine}" if machine else ""),
        "",
        f"Keyed counter behind two unbounded sources, {s['delay'] * 1e3:.1f} ms per record in the keyed stage, "
        f"buffers {tuple(s['buffers'])} (exclusive / floating / output max, 32 KiB each), unaligned checkpoints "
        f"every {s['interval']} ms. The same checkpoint restored once per setting; times from submitting the "
        "attempt (Spark stage start included).",
        "",
        "| checkpoints during recovery | in-flight data restored | records replayed | first checkpoint completed "
        "| replay done | first checkpoint persisted |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in report.runs:
        first = "none" if r.first_checkpoint_s is None else f"{r.first_checkpoint_s:.2f} s"
        replay = "—" if r.replay_s is None else f"{r.replay_s:.2f} s"
        lines.append(f"| {'on' if r.during_recovery else 'off'} | {r.restored_bytes / 1024:,.0f} KiB | "
                     f"{r.replayed_records:,} | {first} | {replay} | {r.first_checkpoint_persisted / 1024:,.0f} KiB |")
    ratio = speedup(report.runs)
    if ratio is not None:
        lines += ["", f"The first checkpoint after the restore completed {ratio:.1f}× sooner with checkpoints during "
                  "recovery. One measurement per setting; no repetitions."]
    return "\n".join(lines) + "\n"


def speedup(runs: list[Restored]) -> float | None:
    """Time to the first checkpoint without the option over the time with it (None: one of them is missing)."""
    off = next((r.first_checkpoint_s for r in runs if not r.during_recovery), None)
    on = next((r.first_checkpoint_s for r in runs if r.during_recovery), None)
    if not off or not on:
        return None
    return off / on


def summary(report: RcReport) -> str:
    parts = [f"{'on' if r.during_recovery else 'off'}: first checkpoint "
             f"{'none' if r.first_checkpoint_s is None else f'{r.first_checkpoint_s:.1f} s'}" for r in report.runs]
    return ", ".join(parts)


# ------------------------------------------------------------------------------------------------ measurement


def measure(spark: Any, url: str, s: RcSettings, status: Callable[[str], None] = lambda m: None) -> RcReport:
    from benchmarks.recovery import counter
    from client.sync import OvertakeClient
    from contract.models import CheckpointConfig
    from spark_plugin.connectors import CollectSink, SequenceSource
    from spark_plugin.driver.run import run_pipeline
    from spark_plugin.network.config import NetworkConfig

    exclusive, floating, out_max = s.buffers
    base = NetworkConfig(exclusive_buffers_per_channel=exclusive, floating_buffers_per_gate=floating,
                         max_buffers_per_output_channel=out_max)
    report = RcReport(settings=asdict(s))
    with tempfile.TemporaryDirectory(prefix="overtake-bench-rc-") as tmp:
        pid_dir = str(Path(tmp))
        name = f"bench-recovery-checkpoints-{int(time.time())}"
        cfg = CheckpointConfig(interval=s.interval, policy="unaligned", timeout=120_000, retained=10)
        status(f"a backpressured run until {s.checkpoints_before} checkpoints completed")
        first = run_pipeline(
            counter(name, CollectSink(), pid_dir, s.delay), spark, url, checkpoint=cfg, network=base,
            stop_after_checkpoints=s.checkpoints_before, finish=False,
        )
        with OvertakeClient(url) as c:
            plan = c.restore_plan(first.job_id)
        restored = sum(seg.length for sub in plan.subtasks
                       for seg in sub.input_channel_state + sub.output_channel_state)
        emitted = {split: n for sub in plan.subtasks if sub.vertex == "src"
                   for (split, _), n in SequenceSource.emitted_per_split(sub.source_offsets).items()}
        # unbounded sources (a source that ran out would send its final checkpoint's barrier aligned, behind the
        # replay). Without the option the run stops once its first checkpoint completed, which is after the replay;
        # with it, the run gets the time the replay took without it and ``tail`` seconds more
        time_limit: float | None = None
        for on in (False, True):
            status(f"restore checkpoint {plan.checkpoint_id} ({restored / 1024:,.0f} KiB in flight), "
                   f"checkpoints during recovery {'on' if on else 'off'}")
            network = NetworkConfig(**{**asdict(base), "checkpoints_during_recovery": on})
            submitted = time.time()
            run = run_pipeline(
                counter(name, CollectSink(), pid_dir, s.delay), spark, url, checkpoint=cfg, network=network,
                job_id=first.job_id, restore_from=plan.checkpoint_id, finish=on,
                stop_after_checkpoints=None if on else 1, time_limit=time_limit if on else None,
            )
            with OvertakeClient(url) as c:
                cps = c.list_checkpoints(first.job_id, limit=1000).items
            replayed, replay_s = replay_end(run.outputs("out"), emitted, submitted)
            first_cp = first_completed(cps, run.attempt)
            time_limit = (replay_s or 0.0) + s.tail
            report.runs.append(Restored(
                during_recovery=on, restored_bytes=restored, replayed_records=replayed,
                first_checkpoint_s=seconds_to_first_checkpoint(cps, run.attempt, submitted), replay_s=replay_s,
                first_checkpoint_persisted=first_cp.persisted_data if first_cp is not None else 0,
            ))
    return report


def write(report: RcReport, out: Path, command: str, machine: str = "") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "recovery-checkpoints.md"
    path.write_text(markdown(report, command, machine))
    (out / "recovery-checkpoints.json").write_text(
        json.dumps({"settings": report.settings, "runs": [asdict(r) for r in report.runs]}, indent=2))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.recovery_checkpoints", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer buffers in flight, a faster keyed stage")
    ap.add_argument("--out", default="bench-results", help="results folder (default bench-results)")
    args = ap.parse_args(argv)
    from app.local import LocalCoordinator
    from benchmarks.recovery import _spark

    s = RcSettings.quick() if args.quick else RcSettings()
    spark = _spark()
    try:
        with tempfile.TemporaryDirectory(prefix="overtake-bench-") as tmp, \
                LocalCoordinator(Path(tmp) / "coord") as live:
            report = measure(spark, live.url, s, lambda m: print(m, file=sys.stderr))
    finally:
        spark.stop()
    command = "python -m benchmarks.recovery_checkpoints " + " ".join(argv if argv is not None else sys.argv[1:])
    path = write(report, Path(args.out), command.strip())
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
