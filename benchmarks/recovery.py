"""Recovery benchmark (FLIP-76 test plan): progress under frequent failures, and recovery time against in-flight data.

    python -m benchmarks.recovery [--duration 60] [--kill-every 10] [--out bench-results]

1. **Progress under failures.** A keyed counter under backpressure (a slow keyed stage behind two unbounded
   sources, Flink-sized 32 KiB buffers) writes into an exactly-once ``FileSink``; the Python worker of a random
   subtask is SIGKILLed about every ``--kill-every`` seconds and the supervisor restarts from the latest checkpoint.
   Reported per policy (aligned, unaligned; one after the other in one run): records committed per minute,
   restarts, checkpoints completed.
2. **Recovery time against in-flight data.** With more network buffers per channel (more data in flight), an
   unaligned run stops after a few checkpoints; a new attempt restores the latest one, at the same parallelism and
   with the keyed stage rescaled (2 -> 4 and 2 -> 1), in one run. Recovery time is from submitting the new attempt
   until its keyed stage processed the last restored in-flight record (or, with nothing in flight, its first
   record).

Writes ``recovery.md`` (and ``recovery.json``) into ``--out``. Needs Java 17+ for local Spark; the coordinator runs
embedded (SQLite) in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spark_plugin.testing.failure_injection import Announce, SlowCountPerKey

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------------------- pipeline parts


def counter(name: str, sink: Any, pid_dir: str, delay: float, count: int | None = None, keyed: int = 2):
    from spark_plugin.connectors import SequenceSource
    from spark_plugin.pipeline import Pipeline

    p = Pipeline(name, parallelism=2)
    (
        p.source(SequenceSource(count=count, keys=64), id="src")
        .map(Announce(pid_dir), id="announce")
        .key_by(lambda r: r[0])
        .process(SlowCountPerKey(pid_dir, delay, stamp=True), id="count", parallelism=keyed)
        .sink(sink, id="out")
    )
    return p


class Killer(threading.Thread):
    """Every ``every`` seconds (once the current attempt's tasks are all up), SIGKILL a random task's worker."""

    def __init__(self, pid_dir: Path, tasks: int, every: float, seed: int = 1) -> None:
        super().__init__(daemon=True, name="killer")
        self.pid_dir, self.tasks, self.every = pid_dir, tasks, every
        self.rng = random.Random(seed)
        self.halt = threading.Event()
        self.kills = 0

    def run(self) -> None:
        last = ""
        while not self.halt.wait(self.every * self.rng.uniform(0.8, 1.2)):
            while not self.halt.is_set():
                stages: dict[str, list[Path]] = defaultdict(list)
                for f in self.pid_dir.glob("*.pid"):
                    stages[f.name.split("-")[0]].append(f)
                ready = sorted(s for s, fs in stages.items() if s > last and len(fs) >= self.tasks)
                if ready:
                    break
                self.halt.wait(0.1)
            else:
                return
            last = ready[-1]
            try:
                os.kill(int(self.rng.choice(stages[last]).read_text()), signal.SIGKILL)
                self.kills += 1
            except (ProcessLookupError, ValueError):
                pass


# ------------------------------------------------------------------------------------------------ scenarios


@dataclass
class ProgressResult:
    policy: str
    duration: float
    kills: int
    restarts: int
    committed: int
    checkpoints_completed: int
    checkpoint_p50_ms: float | None

    @property
    def per_minute(self) -> float:
        return self.committed * 60 / self.duration if self.duration else 0.0


NETWORKS = {
    # name: (exclusive buffers per channel, floating buffers per gate, max buffers per output channel), 32 KiB each
    "small": (1, 1, 1),
    "default": (2, 8, 10),
    "large": (4, 16, 20),
}


RESCALES = {"same": 2, "out": 4, "in": 1}
"""The keyed stage's parallelism in the restoring attempt (it ran with 2)."""


@dataclass
class RecoveryPoint:
    buffers: str
    restored_bytes: int
    restored_records: int
    recovery_s: float
    keyed_parallelism: int = 2
    """The keyed stage's parallelism when restoring (2: as checkpointed)."""


@dataclass
class Report:
    progress: list[ProgressResult] = field(default_factory=list)
    recovery: list[RecoveryPoint] = field(default_factory=list)
    settings: dict = field(default_factory=dict)


def progress_under_failures(spark, url: str, policy: str, duration: float, every: float, delay: float,
                            workdir: Path) -> ProgressResult:
    from client.sync import OvertakeClient
    from contract.models import CheckpointConfig
    from spark_plugin.connectors import FileSink
    from spark_plugin.driver.restart import FixedDelay
    from spark_plugin.driver.supervisor import Supervisor

    pid_dir, out = workdir / f"pids-{policy}", workdir / f"out-{policy}"
    pid_dir.mkdir()
    name = f"bench-recovery-{policy}"
    supervisor = Supervisor(counter(name, FileSink(str(out)), str(pid_dir), delay), FixedDelay(10_000, 0.0))
    killer = Killer(pid_dir, 4, every)
    started = time.monotonic()
    cfg = CheckpointConfig(interval=1000, policy=policy, timeout=60_000, retained=2, max_concurrent=1)

    def stop_at_deadline() -> None:
        with OvertakeClient(url) as c:
            while time.monotonic() - started < duration:
                time.sleep(0.2)
            killer.halt.set()
            jobs = [j for j in c.list_jobs().items if j.name == name]
            if jobs:
                c.cancel_job(jobs[0].id)

    stopper = threading.Thread(target=stop_at_deadline, daemon=True)
    killer.start()
    stopper.start()
    try:
        supervisor.run(spark, url, checkpoint=cfg)
    except Exception as e:  # noqa: BLE001 - cancelled between two attempts: the attempt is refused
        print(f"  {policy}: run ended with {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
    stopper.join(30)
    elapsed = time.monotonic() - started
    committed = sum(len(f.read_text().splitlines()) for f in out.glob("part-*.jsonl"))
    with OvertakeClient(url) as c:
        job = [j for j in c.list_jobs().items if j.name == name][0]
        stats = c.checkpoint_stats(job.id)
        done = c.list_checkpoints(job.id, status="COMPLETED", limit=1000).items
    durations = sorted(cp.end_to_end_duration for cp in done if cp.end_to_end_duration is not None)
    return ProgressResult(
        policy, elapsed, killer.kills, len(supervisor.restarts), committed, stats.counts.completed,
        durations[len(durations) // 2] if durations else None,
    )


def recovery_time(spark, url: str, buffers: str, delay: float, workdir: Path, rescale: str = "same") -> RecoveryPoint:
    from contract.models import CheckpointConfig
    from spark_plugin.connectors import CollectSink
    from spark_plugin.driver.run import run_pipeline
    from spark_plugin.network.config import NetworkConfig

    exclusive, floating, out_max = NETWORKS[buffers]
    network = NetworkConfig(exclusive_buffers_per_channel=exclusive, floating_buffers_per_gate=floating,
                            max_buffers_per_output_channel=out_max)
    pid_dir = workdir / f"pids-restore-{buffers}-{rescale}"
    pid_dir.mkdir()
    name = f"bench-restore-{buffers}-{rescale}"
    cfg = CheckpointConfig(interval=700, policy="unaligned", timeout=60_000, retained=10)
    first = run_pipeline(
        counter(name, CollectSink(), str(pid_dir), delay), spark, url, checkpoint=cfg, network=network,
        stop_after_checkpoints=3, finish=False,
    )
    keyed = RESCALES[rescale]
    restored = timed_restore(
        spark, url, first.job_id, lambda count: counter(name, CollectSink(), str(pid_dir), delay, count=count,
                                                        keyed=keyed),
        checkpoint=cfg, network=network,
    )
    return RecoveryPoint(buffers, restored.restored_bytes, restored.replayed_records, restored.seconds, keyed)


@dataclass
class TimedRestore:
    checkpoint_id: int
    restored_bytes: int
    """In-flight data (input and output channel state) of the restored checkpoint."""
    replayed_records: int
    seconds: float
    replay_seconds: float = 0.0
    """Of ``seconds``: from the first record the new attempt's last stage processed until it caught up."""


def timed_restore(spark, url: str, job_id: int, pipeline_for, source: str = "src", sink: str = "out",
                  **run_options: Any) -> TimedRestore:
    """Restore the job's latest checkpoint in a new attempt of a bounded copy of its pipeline and time it.

    ``pipeline_for(count)`` builds the pipeline with sources that stop at ``count`` records: a little more than
    they had emitted by the checkpoint. Its sink receives ``(key, seq, ..., processed_at)`` (the sequence number
    second, the time the last stage processed the record last). The time is from submitting the new attempt (the
    Spark stage's start included) until the last stage processed the last record that the sources had emitted by
    the checkpoint (the restored in-flight data replayed, the pipeline caught up), or with nothing in flight its
    first record; ``replay_seconds`` leaves the start of the attempt out (from its first processed record on).
    """
    from client.sync import OvertakeClient
    from spark_plugin.driver.run import run_pipeline

    with OvertakeClient(url) as c:
        plan = c.restore_plan(job_id)
    restored_bytes = sum(s.length for sub in plan.subtasks for s in sub.input_channel_state + sub.output_channel_state)
    # records each sequence split had emitted by the checkpoint (seq % splits is the split)
    from spark_plugin.connectors import SequenceSource

    emitted = {split: n for sub in plan.subtasks if sub.vertex == source
               for (split, _), n in SequenceSource.emitted_per_split(sub.source_offsets).items()}
    splits = len(emitted)
    count = splits * max(emitted.values()) + 2_000
    submitted = time.time()
    second = run_pipeline(pipeline_for(count), spark, url, job_id=job_id, restore_from=plan.checkpoint_id,
                          **run_options)
    # what the new attempt processed (a collecting sink also holds the output it restored from the checkpoint)
    out = [r for r in second.outputs(sink) if r[-1] >= submitted]
    # a record is restored in-flight data when its source had emitted it by the checkpoint
    replayed = [r for r in out if r[1] // splits < emitted[r[1] % splits]]
    first_at = min(r[-1] for r in out)
    done_at = max(r[-1] for r in replayed) if replayed else first_at
    return TimedRestore(plan.checkpoint_id, restored_bytes, len(replayed), done_at - submitted, done_at - first_at)


# -------------------------------------------------------------------------------------------------- report


def markdown(report: Report, command: str) -> str:
    s = report.settings
    lines = [
        "# Recovery benchmark",
        "",
        f"`{command}` — {s['cpus']} cores; local Spark `local[8]`; embedded coordinator (SQLite).",
        "",
        f"## Progress under failures (a SIGKILLed subtask every ~{s['kill_every']:.0f} s, {s['duration']:.0f} s per "
        "policy, one run)",
        "",
        f"Keyed counter behind two unbounded sources, {s['delay'] * 1e3:.1f} ms per record in the keyed stage "
        "(backpressure), 32 KiB buffers, checkpoint every second, exactly-once `FileSink`.",
        "",
        "| policy | records committed / min | kills | restarts | checkpoints completed | checkpoint p50 |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in report.progress:
        p50 = f"{p.checkpoint_p50_ms / 1000:.1f} s" if p.checkpoint_p50_ms is not None else "—"
        lines.append(f"| {p.policy} | {p.per_minute:,.0f} | {p.kills} | {p.restarts} | {p.checkpoints_completed} "
                     f"| {p50} |")
    lines += [
        "",
        "## Recovery time against restored in-flight data (unaligned)",
        "",
        "From submitting the new attempt (Spark stage start included) until the keyed stage processed the last "
        "restored in-flight record; the keyed stage ran with parallelism 2 and restores with 2 (as checkpointed), "
        "4 or 1 (rescaled: its state and in-flight records redistributed by key group).",
        "",
        "| buffers (exclusive / floating / output max) | keyed stage | in-flight data restored | records replayed "
        "| recovery time |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for r in report.recovery:
        scaled = "2" if r.keyed_parallelism == 2 else f"2 → {r.keyed_parallelism}"
        lines.append(f"| {r.buffers} {NETWORKS[r.buffers]} | {scaled} | {r.restored_bytes / 1024:,.0f} KiB | "
                     f"{r.restored_records:,} | {r.recovery_s:.2f} s |")
    return "\n".join(lines) + "\n"


def _spark():
    from spark_plugin.driver.session import spark_session

    return spark_session(8, "overtake-bench-recovery", import_paths=[ROOT], pin_python=True, log_level="OFF")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.recovery", description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=60.0, help="seconds per policy under failures (default 60)")
    ap.add_argument("--kill-every", type=float, default=10.0, help="seconds between kills (default 10)")
    ap.add_argument("--delay", type=float, default=0.0003, help="seconds per record in the keyed stage")
    ap.add_argument("--buffers", default="small,default,large", help=f"network sizes for the recovery-time runs: "
                    f"{', '.join(NETWORKS)}")
    ap.add_argument("--rescales", default="same,out,in", help=f"keyed-stage parallelism when restoring: "
                    f"{', '.join(f'{k} ({v})' for k, v in RESCALES.items())}")
    ap.add_argument("--skip-progress", action="store_true")
    ap.add_argument("--skip-recovery", action="store_true")
    ap.add_argument("--out", default="bench-results", help="results folder (default bench-results)")
    args = ap.parse_args(argv)

    from app.local import LocalCoordinator

    report = Report(settings={"duration": args.duration, "kill_every": args.kill_every, "delay": args.delay,
                              "cpus": os.cpu_count()})
    spark = _spark()
    with tempfile.TemporaryDirectory(prefix="overtake-bench-") as tmp, LocalCoordinator(Path(tmp) / "coord") as live:
        work = Path(tmp)
        if not args.skip_progress:
            for policy in ("aligned", "unaligned"):
                print(f"progress under failures: {policy} ...", file=sys.stderr)
                report.progress.append(
                    progress_under_failures(spark, live.url, policy, args.duration, args.kill_every, args.delay,
                                            work)
                )
        if not args.skip_recovery:
            for buffers in (x for x in args.buffers.split(",") if x):
                for rescale in (x for x in args.rescales.split(",") if x):
                    print(f"recovery time: {buffers} network buffers, keyed stage {rescale} ...", file=sys.stderr)
                    report.recovery.append(recovery_time(spark, live.url, buffers, args.delay, work, rescale))
    spark.stop()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.recovery " + " ".join(argv if argv is not None else sys.argv[1:])
    text = markdown(report, command.strip())
    (out / "recovery.md").write_text(text)
    data = {"settings": report.settings, "progress": [asdict(p) | {"per_minute": p.per_minute}
                                                      for p in report.progress],
            "recovery": [asdict(r) for r in report.recovery]}
    (out / "recovery.json").write_text(json.dumps(data, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
