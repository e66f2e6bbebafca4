"""A randomized rescale soak on Spark: the threads soak's claim (``benchmarks.soak``) on the real runtime.

    python -m benchmarks.soak_spark --cases 20 --seed 1 [--out bench-results]

Each case draws from its seed a keyed counter (a sequence source on 1–3 subtasks, a hash edge, a keyed stage on
1–3 subtasks counting per key, the exactly-once ``FileSink`` chained to it), runs it on local Spark with unaligned
checkpoints under backpressure until it completed 1–3 of them, and stops. Then the same job runs again from its
latest checkpoint with the keyed stage at another parallelism (up or down, 1–4) and, in half the cases, the source
too (its splits move whole), through the documented path (``run_pipeline(job_id=...)``: the coordinator plans the
rescale). In a third of the cases that second attempt runs under the supervisor and one of its tasks' Python worker
is SIGKILLed soon after every task runs (during the replay of the rescaled in-flight data, or just after it), and
the supervisor restarts it. Every case checks the sink's files: every record counted exactly once, each key's counts
1..n, and within a key the records of each source split in their order.

Writes ``soak-spark.md`` (and ``.json``) into ``--out``. Needs Java 17+; runs the coordinator embedded (SQLite).
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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spark_plugin.connectors import SequenceSource

ROOT = Path(__file__).resolve().parents[1]
KEYS = 32


@dataclass(frozen=True)
class Case:
    seed: int
    count: int
    sources: int
    keyed: int
    checkpoints: int
    new_sources: int
    new_keyed: int
    kill: bool

    @classmethod
    def draw(cls, seed: int) -> Case:
        rng = random.Random(seed)
        sources, keyed = rng.randint(1, 3), rng.randint(1, 3)
        new_keyed = rng.choice([p for p in range(1, 5) if p != keyed])
        new_sources = rng.randint(1, 3) if rng.random() < 0.5 else sources
        return cls(seed, rng.randint(3_000, 8_000), sources, keyed, rng.randint(1, 3), new_sources, new_keyed,
                   rng.random() < 1 / 3)

    def describe(self) -> str:
        src = f"src {self.sources}" + (f"->{self.new_sources}" if self.new_sources != self.sources else "")
        return (f"seed {self.seed}: {self.count} records, {src}, keyed {self.keyed}->{self.new_keyed}, "
                f"{self.checkpoints} checkpoint(s) first" + (", a kill after the rescale" if self.kill else ""))


@dataclass
class Outcome:
    case: Case
    records: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    restored_checkpoint: int | None = None
    kills: int = 0
    seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not (self.lost or self.duplicated or self.reordered)


@dataclass
class SoakReport:
    outcomes: list[Outcome] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- the check


def check(rows: list[tuple[int, int, int]], count: int, splits: int) -> tuple[int, int, int]:
    """(lost, duplicated, reordered) of a keyed count's ``(key, seq, n)`` rows over seqs ``0..count-1``: a seq
    missing or repeated, or within a key counts that are not 1..n in the order of each split's seqs (split: ``seq %
    splits``)."""
    seen: dict[int, int] = defaultdict(int)
    by_key: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for key, seq, n in rows:
        seen[seq] += 1
        by_key[key].append((n, seq))
    lost = sum(1 for s in range(count) if s not in seen)
    duplicated = sum(c - 1 for c in seen.values() if c > 1)
    reordered = 0
    for got in by_key.values():
        got.sort()
        if [n for n, _ in got] != list(range(1, len(got) + 1)):
            reordered += 1  # counts repeated or skipped within the key
            continue
        for r in range(splits):
            from_r = [s for _, s in got if s % splits == r]
            reordered += from_r != sorted(from_r)
    return lost, duplicated, reordered


def file_rows(directory: Path) -> list[tuple[int, int, int]]:
    return [tuple(json.loads(line))[:3] for f in sorted(directory.glob("part-*.jsonl"))
            for line in f.read_text().splitlines()]


# ---------------------------------------------------------------------------------------------- one case


class _Held:
    """A split reader that keeps its split's last tenth until the file ``release`` exists (the kill landed)."""

    def __init__(self, reader: Any, release: str) -> None:
        self.reader, self.release = reader, release

    def _held(self) -> bool:
        return (self.reader.limit is not None and self.reader.k >= self.reader.limit * 9 // 10
                and not os.path.exists(self.release))

    def poll(self, max_records: int) -> Any:
        return [] if self._held() else self.reader.poll(max_records)

    def wait_hint(self) -> float | None:
        return 0.05 if self._held() else self.reader.wait_hint()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reader, name)


class HeldSequenceSource(SequenceSource):
    """A ``SequenceSource`` whose splits keep their last tenth until the file ``release`` exists. It announces its
    task's pid while it polls, held or not: a run restored where the splits were already held sends no record, so
    nothing else would announce the stage to the killer."""

    def __init__(self, count: int, keys: int, release: str, pid_dir: str) -> None:
        super().__init__(count=count, keys=keys)
        self.release_file = release  # not ``release``: that is the Source's method the runtime calls
        self.pid_dir = pid_dir

    def poll(self, max_records: int) -> Any:
        from spark_plugin.testing.failure_injection import announce

        announce(self.pid_dir)
        return super().poll(max_records)

    def build_split_reader(self, split: Any, position: Any) -> Any:
        return _Held(super().build_split_reader(split, position), self.release_file)


def pipeline(name: str, case: Case, out: str, pid_dir: str, second: bool, delay: float = 0.0003,
             release: str | None = None) -> Any:
    """``release``: the sources keep their last tenth until that file exists."""
    from spark_plugin.connectors import FileSink
    from spark_plugin.pipeline import Pipeline
    from spark_plugin.testing.failure_injection import Announce, SlowCountPerKey

    p = Pipeline(name, parallelism=case.new_keyed if second else case.keyed)
    if release is None:
        source = SequenceSource(count=case.count, keys=KEYS)
    else:
        source = HeldSequenceSource(case.count, KEYS, release, pid_dir)
    (
        p.source(source, id="src", parallelism=case.new_sources if second else case.sources)
        .map(Announce(pid_dir), id="announce")
        .key_by(lambda r: r[0])
        .process(SlowCountPerKey(pid_dir, delay), id="count")
        .sink(FileSink(out), id="out")
    )
    return p


def _kill_once(pid_dir: Path, tasks: int, after: str, rng: random.Random, halt: threading.Event,
               killed: list[int], release: Path) -> None:
    """SIGKILL one task of the first stage after ``after`` whose ``tasks`` tasks all announced, 0.2–1.5 s later;
    then (or when halted) create ``release``."""
    try:
        _kill(pid_dir, tasks, after, rng, halt, killed)
    finally:
        release.touch()


def _kill(pid_dir: Path, tasks: int, after: str, rng: random.Random, halt: threading.Event,
          killed: list[int], within: float = 120.0) -> None:
    """Once tasks of the first stage after ``after`` run (all ``tasks`` announced, or some did and 2 s passed: a
    source subtask left without a split after a rescale announces nothing), wait 0.2–1.5 s and SIGKILL one of the
    announced ones. Gives up after ``within`` seconds."""
    deadline = time.monotonic() + within
    first_seen: float | None = None
    while not halt.is_set() and time.monotonic() < deadline:
        stages: dict[str, list[Path]] = defaultdict(list)
        for f in pid_dir.glob("*.pid"):
            stages[f.name.split("-")[0]].append(f)
        newer = sorted(s for s in stages if s > after)
        if newer:
            first_seen = first_seen or time.monotonic()
            stage = newer[0]
            if len(stages[stage]) >= tasks or time.monotonic() - first_seen > 2.0:
                if halt.wait(rng.uniform(0.2, 1.5)):
                    return
                try:
                    pid = int(rng.choice(sorted(stages[stage])).read_text())
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except (ProcessLookupError, ValueError, FileNotFoundError):
                    pass
                return
        halt.wait(0.05)


def run_case(spark: Any, url: str, case: Case, work: Path) -> Outcome:
    from contract.models import CheckpointConfig
    from spark_plugin.driver.restart import FixedDelay
    from spark_plugin.driver.run import run_pipeline
    from spark_plugin.driver.supervisor import Supervisor
    from spark_plugin.network.config import NetworkConfig

    outcome = Outcome(case)
    started = time.monotonic()
    out, pids = work / f"out-{case.seed}", work / f"pids-{case.seed}"
    pids.mkdir(parents=True)
    name = f"soak-spark-{case.seed}"
    cfg = CheckpointConfig(interval=300, policy="unaligned", timeout=60_000, retained=3)
    network = NetworkConfig(buffer_size=1024)
    try:
        release = work / f"release-{case.seed}"
        # with a kill to come, the first run's sources hold their last tenth too: a checkpoint that already holds
        # every record (a fast source before a slow checkpoint) would leave the second run nothing to read, and it
        # could end before the kill landed
        first = run_pipeline(pipeline(name, case, str(out), str(pids), False, release=str(release) if case.kill else None),
                             spark, url, checkpoint=cfg, network=network, stop_after_checkpoints=case.checkpoints,
                             finish=False)
        stages = sorted(f.name.split("-")[0] for f in pids.glob("*.pid"))
        second = pipeline(name, case, str(out), str(pids), True, release=str(release) if case.kill else None)
        if case.kill:
            # the sources hold their last tenth until the kill landed: a short rest cannot end the run before it
            halt, killed = threading.Event(), []
            killer = threading.Thread(
                target=_kill_once, daemon=True,
                args=(pids, case.new_sources + case.new_keyed, stages[-1] if stages else "", random.Random(case.seed),
                      halt, killed, release))
            killer.start()
            try:
                result = Supervisor(second, FixedDelay(3, 0.0)).run(
                    spark, url, job_id=first.job_id, restore_from="latest", checkpoint=cfg, network=network)
            finally:
                halt.set()
                killer.join(5)
            outcome.kills = len(killed)
        else:
            result = run_pipeline(second, spark, url, job_id=first.job_id, restore_from="latest", checkpoint=cfg,
                                  network=network)
        outcome.restored_checkpoint = result.restore_plan.checkpoint_id if result.restore_plan else None
        rows = file_rows(out)
        outcome.records = len(rows)
        outcome.lost, outcome.duplicated, outcome.reordered = check(rows, case.count, case.sources)
    except Exception as e:  # noqa: BLE001 - the case failed: said in the report, the soak goes on
        outcome.error = f"{type(e).__name__}: {str(e)[:300]}"
    outcome.seconds = time.monotonic() - started
    return outcome


def soak(spark: Any, url: str, cases: int, seed: int, status: Callable[[str], None] = lambda m: None,
         seconds: float | None = None) -> SoakReport:
    report = SoakReport()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="overtake-soak-spark-") as tmp:
        for i in range(cases):
            if seconds is not None and time.monotonic() - began > seconds:
                break
            case = Case.draw(seed + i)
            o = run_case(spark, url, case, Path(tmp))
            report.outcomes.append(o)
            verdict = "ok" if o.ok else (o.error or f"lost {o.lost}, duplicated {o.duplicated}, reordered {o.reordered}")
            status(f"[{i + 1}/{cases}] {case.describe()}: {o.records} records, restored checkpoint "
                   f"{o.restored_checkpoint}, {o.kills} kill(s), {o.seconds:.1f} s: {verdict}")
    return report


# ------------------------------------------------------------------------------------------------- report


def totals(report: SoakReport) -> dict[str, int]:
    os_ = report.outcomes
    return {
        "cases": len(os_),
        "rescales": sum(1 for o in os_ if o.error is None),
        "source rescales": sum(1 for o in os_ if o.error is None and o.case.new_sources != o.case.sources),
        "kills": sum(o.kills for o in os_),
        "records": sum(o.records for o in os_),
        "lost": sum(o.lost for o in os_),
        "duplicated": sum(o.duplicated for o in os_),
        "reordered": sum(o.reordered for o in os_),
        "failed": sum(1 for o in os_ if not o.ok),
    }


def markdown(report: SoakReport, command: str) -> str:
    t = totals(report)
    minutes = sum(o.seconds for o in report.outcomes) / 60
    lines = [
        "# Randomized rescale soak on Spark",
        "",
        f"`{command}`",
        "",
        "| cases | rescales (keyed stage) | of them the source too | kills after the rescale | records checked | lost "
        "| duplicated | reordered | failed cases | time |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| {t['cases']} | {t['rescales']} | {t['source rescales']} | {t['kills']} | {t['records']:,} | {t['lost']} "
        f"| {t['duplicated']} | {t['reordered']} | {t['failed']} | {minutes:.1f} min |",
        "",
        "| case | records | restored | kills | result |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for o in report.outcomes:
        verdict = "ok" if o.ok else (o.error or f"lost {o.lost}, duplicated {o.duplicated}, reordered {o.reordered}")
        lines.append(f"| {o.case.describe()} | {o.records:,} | {o.restored_checkpoint or '–'} | {o.kills} | "
                     f"{verdict} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.soak_spark", description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1, help="seed of the first case (case n has seed + n)")
    ap.add_argument("--seconds", type=float, help="start no case after this long")
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    args = ap.parse_args(argv)
    from app.local import LocalCoordinator
    from spark_plugin.driver.session import spark_session

    spark = spark_session(8, "overtake-soak-spark", import_paths=[ROOT], pin_python=True, log_level="OFF")
    try:
        with tempfile.TemporaryDirectory(prefix="overtake-bench-") as tmp, \
                LocalCoordinator(Path(tmp) / "coord") as live:
            report = soak(spark, live.url, args.cases, args.seed, lambda m: print(m, flush=True), args.seconds)
    finally:
        spark.stop()
    command = "python -m benchmarks.soak_spark " + " ".join(argv if argv is not None else sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak-spark.json").write_text(json.dumps([asdict(o) for o in report.outcomes], indent=2))
    (args.out / "soak-spark.md").write_text(markdown(report, command.strip()))
    t = totals(report)
    print(f"{t['cases']} cases, {t['rescales']} rescales, {t['kills']} kills, {t['records']:,} records: lost "
          f"{t['lost']}, duplicated {t['duplicated']}, reordered {t['reordered']}; failed cases {t['failed']}")
    return 0 if t["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
