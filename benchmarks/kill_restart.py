"""Scenario 18: from a killed subtask to the job running again, over repeated kills, and where the time goes.

    python -m benchmarks.kill_restart [--quick] [--kills N] [--out bench-results]     (or: overtake bench kill-restart)

A keyed counter behind two unbounded sources (four Spark tasks), checkpointed unaligned every 500 ms, runs under the
supervisor with restarts at once (``FixedDelay(delay=0)``: the time measured is what the system takes, not a
back-off). Once every task of the current attempt runs, and a few seconds later, one task's Python worker is
SIGKILLed; this repeats ``kills`` times. Per kill, with the kill's wall-clock time as zero:

- *attempt opened*: the supervisor opened the next attempt with the coordinator (Spark noticed the failure, failed
  the stage, and the supervisor asked for the restore plan);
- *running*: every task of the new attempt took its first record (each task writes its pid when it does; the last
  file's time), i.e. launched, restored and running;
- *first checkpoint*: the new attempt's first checkpoint completed.

And the coordinator's own recovery phases of each new attempt (``AttemptInfo.phases``, read while it is current):
detect (the previous attempt's last report to the new attempt's start), relaunch (start to the first restored
subtask running), restore (the longest state load), replay.

Writes ``kill-restart.md`` (and ``.json``) into ``--out``. Needs Java 17+ for local Spark; standalone it runs the
coordinator embedded (SQLite) in a temporary directory.
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

ROOT = Path(__file__).resolve().parents[1]

TASKS = 4
"""Spark task slots the scenario needs: two source chains and two keyed-stage chains."""


@dataclass
class KrSettings:
    kills: int = 10
    settle: float = 4.0
    """Seconds after every task of an attempt runs before its kill (checkpoints complete meanwhile)."""
    delay: float = 0.0003
    """Seconds per record in the keyed stage (backpressure: in-flight data to restore)."""
    interval: int = 500
    seed: int = 7

    @classmethod
    def quick(cls) -> KrSettings:
        return cls(kills=3, settle=3.0)


@dataclass
class Kill:
    at_ms: int
    """Wall clock of the SIGKILL (ms since the epoch)."""
    stage: str
    """The killed task's Spark stage (each attempt is a new stage)."""
    attempt_opened_s: float | None = None
    running_s: float | None = None
    first_checkpoint_s: float | None = None
    attempt: int | None = None
    phases: dict = field(default_factory=dict)


@dataclass
class KrReport:
    settings: dict = field(default_factory=dict)
    kills: list[Kill] = field(default_factory=list)


# ---------------------------------------------------------------------------------------- arithmetic (no Spark)


def pct(xs: list[float], q: float) -> float | None:
    d = sorted(x for x in xs if x is not None)
    return d[min(len(d) - 1, int(round(q * (len(d) - 1))))] if d else None


def stages_up(pid_dir: Path, tasks: int) -> dict[str, float]:
    """Each Spark stage whose ``tasks`` tasks all announced themselves, and when the last did (epoch seconds)."""
    by: dict[str, list[float]] = defaultdict(list)
    for f in pid_dir.glob("*.pid"):
        try:
            by[f.name.split("-")[0]].append(f.stat().st_mtime)
        except FileNotFoundError:
            continue
    return {s: max(ts) for s, ts in by.items() if len(ts) >= tasks}


def attribute(kills: list[Kill], attempts: list[Any], checkpoints: list[Any], up: dict[str, float],
              phases: dict[int, dict]) -> None:
    """Fill each kill's times: the first attempt opened after it, the first stage after the killed one that had
    every task up, and that attempt's first completed checkpoint."""
    opened = sorted((a.started_at, a.attempt) for a in attempts)
    for k in kills:
        nxt = next(((t, a) for t, a in opened if t >= k.at_ms), None)
        if nxt is None:
            continue
        k.attempt = nxt[1]
        k.attempt_opened_s = (nxt[0] - k.at_ms) / 1000
        later = sorted(s for s in up if s > k.stage)
        if later:
            k.running_s = up[later[0]] - k.at_ms / 1000
        done = [c.trigger_timestamp + c.end_to_end_duration for c in checkpoints
                if c.attempt == k.attempt and c.end_to_end_duration is not None
                and getattr(c.status, "value", c.status) == "COMPLETED"]
        if done:
            k.first_checkpoint_s = (min(done) - k.at_ms) / 1000
        k.phases = phases.get(k.attempt, {})


# --------------------------------------------------------------------------------------------- measuring


class Killer(threading.Thread):
    """``kills`` times: wait until every task of a newer stage runs, ``settle`` seconds more, SIGKILL one of them."""

    def __init__(self, pid_dir: Path, settings: KrSettings, status: Callable[[str], None]) -> None:
        super().__init__(daemon=True, name="killer")
        self.pid_dir, self.s, self.status = pid_dir, settings, status
        self.rng = random.Random(settings.seed)
        self.halt = threading.Event()
        self.kills: list[Kill] = []

    def run(self) -> None:
        last = ""
        while len(self.kills) < self.s.kills and not self.halt.is_set():
            ready = sorted(s for s in stages_up(self.pid_dir, TASKS) if s > last)
            if not ready:
                self.halt.wait(0.05)
                continue
            stage = ready[-1]
            if self.halt.wait(self.s.settle):
                return
            files = sorted(self.pid_dir.glob(f"{stage}-*.pid"))
            try:
                pid = int(self.rng.choice(files).read_text())
                at = int(time.time() * 1000)
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, ValueError, IndexError, FileNotFoundError):
                continue  # that attempt ended on its own: wait for the next
            self.kills.append(Kill(at, stage))
            self.status(f"kill {len(self.kills)}/{self.s.kills}: stage {stage}, pid {pid}")
            last = stage


def measure(spark: Any, url: str, s: KrSettings, status: Callable[[str], None] = lambda m: None) -> KrReport:
    from benchmarks.recovery import counter
    from client.sync import OvertakeClient
    from contract.models import CheckpointConfig
    from spark_plugin.connectors import DiscardSink
    from spark_plugin.driver.restart import FixedDelay
    from spark_plugin.driver.supervisor import Supervisor

    work = Path(tempfile.mkdtemp(prefix="overtake-kill-restart-"))
    pid_dir = work / "pids"
    pid_dir.mkdir()
    name = f"bench-kill-restart-{int(time.time())}"
    supervisor = Supervisor(counter(name, DiscardSink(), str(pid_dir), s.delay), FixedDelay(s.kills + 5, 0.0))
    killer = Killer(pid_dir, s, status)
    phases: dict[int, dict] = {}
    state: dict[str, Any] = {"job": None}
    done = threading.Event()

    def watch() -> None:
        """Keep each attempt's recovery phases while it is the current one; end the job once the last kill's
        attempt completed a checkpoint."""
        with OvertakeClient(url) as c:
            while not done.is_set():
                time.sleep(0.25)
                try:
                    if state["job"] is None:
                        jobs = [j for j in c.list_jobs().items if j.name == name]
                        state["job"] = jobs[0].id if jobs else None
                        continue
                    for a in c.list_attempts(state["job"]).items:
                        if a.ended_at is None and a.phases is not None:
                            phases[a.attempt] = a.phases.model_dump()
                    if len(killer.kills) >= s.kills:
                        after = [a.attempt for a in c.list_attempts(state["job"]).items
                                 if a.started_at >= killer.kills[-1].at_ms]
                        cps = c.list_checkpoints(state["job"], status="COMPLETED", limit=20).items
                        if after and any(cp.attempt == max(after) for cp in cps):
                            time.sleep(1.0)  # the last attempt's phases (its replay) reported
                            for a in c.list_attempts(state["job"]).items:
                                if a.ended_at is None and a.phases is not None:
                                    phases[a.attempt] = a.phases.model_dump()
                            c.cancel_job(state["job"])
                            return
                except Exception as e:  # noqa: BLE001 - a busy coordinator: look again
                    status(f"  (watch: {type(e).__name__}: {str(e)[:120]})")

    watcher = threading.Thread(target=watch, daemon=True, name="kill-restart-watch")
    killer.start()
    watcher.start()
    try:
        supervisor.run(spark, url, checkpoint=CheckpointConfig(interval=s.interval, policy="unaligned",
                                                             timeout=60_000, retained=2))
    except Exception as e:  # noqa: BLE001 - cancelled between two attempts: the attempt is refused
        status(f"  run ended with {type(e).__name__}: {str(e)[:200]}")
    finally:
        done.set()
        killer.halt.set()
        watcher.join(30)
        killer.join(10)
    report = KrReport(settings=asdict(s), kills=killer.kills)
    if state["job"] is None:
        return report
    with OvertakeClient(url) as c:
        attempts = c.list_attempts(state["job"], limit=200).items
        checkpoints = c.list_checkpoints(state["job"], limit=1000).items
    attribute(report.kills, attempts, checkpoints, stages_up(pid_dir, TASKS), phases)
    return report


# ------------------------------------------------------------------------------------------------- report


def _s(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f} s"


def _ms(x: Any) -> str:
    return "–" if x is None else f"{x / 1000:.2f} s"


def summary(report: KrReport) -> str:
    run = [k.running_s for k in report.kills]
    first = [k.first_checkpoint_s for k in report.kills]
    return (f"{len(report.kills)} kills: kill → running p50 {_s(pct(run, 0.5))}, p90 {_s(pct(run, 0.9))}; "
            f"kill → first checkpoint p50 {_s(pct(first, 0.5))}, p90 {_s(pct(first, 0.9))}")


def markdown(report: KrReport, command: str, machine: str = "") -> str:
    s = report.settings
    ks = report.kills

    def col(get: Callable[[Kill], Any], ms: bool = False) -> tuple[str, str]:
        xs = [get(k) for k in ks]
        xs = [x for x in xs if x is not None]
        f = _ms if ms else _s
        return f(pct(xs, 0.5)), f(pct(xs, 0.9))

    rows = [
        ("kill → attempt opened", col(lambda k: k.attempt_opened_s)),
        ("kill → every task running", col(lambda k: k.running_s)),
        ("kill → first checkpoint completed", col(lambda k: k.first_checkpoint_s)),
        ("detect (coordinator's phase)", col(lambda k: k.phases.get("detect_ms"), ms=True)),
        ("relaunch (attempt start → first restored subtask running)", col(lambda k: k.phases.get("relaunch_ms"), True)),
        ("restore (longest state load)", col(lambda k: k.phases.get("restore_ms"), ms=True)),
        ("replay", col(lambda k: k.phases.get("replay_ms"), ms=True)),
    ]
    lines = [
        "# Kill to running",
        "",
        f"`{command}`" + (f" — {machine}" if machine else ""),
        "",
        f"Keyed counter behind two unbounded sources (4 Spark tasks), {s['delay'] * 1e3:.1f} ms per record in the "
        f"keyed stage, unaligned checkpoints every {s['interval']} ms, restarts at once; {len(ks)} kills of a random "
        f"task's Python worker, each {s['settle']:g} s after every task of the attempt ran.",
        "",
        "| from the kill to | p50 | p90 |",
        "| --- | ---: | ---: |",
        *[f"| {label} | {p50} | {p90} |" for label, (p50, p90) in rows],
        "",
        "| kill | attempt | opened | running | first checkpoint | detect | relaunch | restore | replay |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for i, k in enumerate(ks, 1):
        p = k.phases
        lines.append(f"| {i} | {k.attempt or '–'} | {_s(k.attempt_opened_s)} | {_s(k.running_s)} | "
                     f"{_s(k.first_checkpoint_s)} | {_ms(p.get('detect_ms'))} | {_ms(p.get('relaunch_ms'))} | "
                     f"{_ms(p.get('restore_ms'))} | {_ms(p.get('replay_ms'))} |")
    return "\n".join(lines) + "\n"


def write(report: KrReport, out: Path, command: str, machine: str = "") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "kill-restart.json").write_text(json.dumps(asdict(report), indent=2))
    path = out / "kill-restart.md"
    path.write_text(markdown(report, command, machine))
    return path


def _one(s: KrSettings, preload: bool) -> KrReport:
    from app.local import LocalCoordinator
    from spark_plugin.driver.session import spark_session

    spark = spark_session(8, "overtake-bench-kill-restart", import_paths=[ROOT], pin_python=True, log_level="OFF",
                          preload=preload)
    try:
        with tempfile.TemporaryDirectory(prefix="overtake-bench-") as tmp, \
                LocalCoordinator(Path(tmp) / "coord") as live:
            return measure(spark, live.url, s, lambda m: print(m, file=sys.stderr, flush=True))
    finally:
        spark.stop()


def compare(s: KrSettings, rounds: int, status: Callable[[str], None]) -> dict[str, KrReport]:
    """Each setting of ``preload`` in its own process (a Spark context fixes its daemon when it starts), taken by
    turns, ``rounds`` times each, ``s.kills`` kills per process: one report per setting."""
    import subprocess

    merged = {"preload": KrReport(settings=asdict(s)), "no preload": KrReport(settings=asdict(s))}
    with tempfile.TemporaryDirectory(prefix="overtake-bench-kr-") as tmp:
        for r in range(rounds):
            for key, flag in (("no preload", "off"), ("preload", "on")):
                out = Path(tmp) / f"{key.replace(' ', '-')}-{r}"
                status(f"round {r + 1}/{rounds}: {key}")
                subprocess.run(
                    [sys.executable, "-m", "benchmarks.kill_restart", "--preload", flag, "--kills", str(s.kills),
                     "--settle", str(s.settle), "--out", str(out)],
                    cwd=ROOT, check=True, timeout=60 + 60 * s.kills,
                )
                data = json.loads((out / "kill-restart.json").read_text())
                merged[key].kills += [Kill(**k) for k in data["kills"]]
    return merged


def compare_markdown(reports: dict[str, KrReport], command: str, machine: str = "") -> str:
    keys = ("no preload", "preload")
    ks = {k: reports[k].kills for k in keys}
    s = reports["preload"].settings

    def stat(k: str, get: Callable[[Kill], Any], q: float, ms: bool = False) -> str:
        xs = [x for x in (get(x) for x in ks[k]) if x is not None]
        return (_ms if ms else _s)(pct(xs, q))

    rows = [
        ("kill → attempt opened", lambda k: k.attempt_opened_s, False),
        ("kill → every task running", lambda k: k.running_s, False),
        ("kill → first checkpoint completed", lambda k: k.first_checkpoint_s, False),
        ("detect", lambda k: k.phases.get("detect_ms"), True),
        ("relaunch (attempt start → first restored subtask running)", lambda k: k.phases.get("relaunch_ms"), True),
        ("restore (longest state load)", lambda k: k.phases.get("restore_ms"), True),
        ("replay", lambda k: k.phases.get("replay_ms"), True),
    ]
    lines = [
        "# Kill to running: fresh Python workers against workers forked from a preloaded daemon",
        "",
        f"`{command}`" + (f" — {machine}" if machine else ""),
        "",
        f"Keyed counter behind two unbounded sources (4 Spark tasks), {s['delay'] * 1e3:.1f} ms per record in the "
        f"keyed stage, unaligned checkpoints every {s['interval']} ms, restarts at once; per setting "
        f"{len(ks['preload'])} kills of a random task's Python worker, each {s['settle']:g} s after every task of "
        "the attempt ran; the two settings by turns, each in its own process.",
        "",
        "| from the kill to | no preload p50 | p90 | preload p50 | p90 |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for label, get, ms in rows:
        lines.append(f"| {label} | {stat('no preload', get, 0.5, ms)} | {stat('no preload', get, 0.9, ms)} | "
                     f"{stat('preload', get, 0.5, ms)} | {stat('preload', get, 0.9, ms)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kill_restart", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 kills")
    ap.add_argument("--kills", type=int, help="kills (per process with --compare)")
    ap.add_argument("--settle", type=float, help="seconds after every task runs before a kill")
    ap.add_argument("--preload", choices=("on", "off"), default="on",
                    help="the executors' PySpark daemon preloads Overtake's task code (the default) or not")
    ap.add_argument("--compare", type=int, metavar="ROUNDS",
                    help="both settings by turns, ROUNDS processes each: one report of the two")
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    args = ap.parse_args(argv)
    s = KrSettings.quick() if args.quick else KrSettings()
    if args.kills:
        s.kills = args.kills
    if args.settle:
        s.settle = args.settle
    command = "python -m benchmarks.kill_restart " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.compare:
        reports = compare(s, args.compare, lambda m: print(m, file=sys.stderr, flush=True))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "kill-restart-compare.json").write_text(
            json.dumps({k: asdict(v) for k, v in reports.items()}, indent=2))
        path = args.out / "kill-restart-compare.md"
        path.write_text(compare_markdown(reports, command.strip()))
        print(path.read_text())
        return 0
    report = _one(s, args.preload == "on")
    path = write(report, args.out, command.strip())
    print(summary(report))
    print(f"report in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
