"""Trigger spacing (``overtake bench triggers``): how close to its interval the coordinator triggers periodic
checkpoints, down to 10 ms.

A job of ``subtasks`` subtasks with a periodic interval; a player follows the job's event stream and acknowledges
every checkpoint for all its subtasks in one batch request as soon as the trigger arrives (what the host's ack relay
does, with no pipeline and no state: the checkpoints are as short as the control path allows). From the coordinator's
own timestamps in the events, per interval:

* *spacing*: from one trigger to the next (the interval honoured: spacing = interval; a checkpoint still pending when
  the next falls due delays it, since a job has one pending at a time unless ``max_concurrent`` says more: each
  interval is measured at every ``max_concurrent`` of ``--max-concurrent``, 1 and 2 by default);
* *drift*: the spacing's p50 over the first and over the last fifth of the run's triggers (a completion whose cost
  grew with the job's history once took the spacing at 10 ms from 11 to 29 ms within 5 s, every result right);
* *duration*: from a trigger to its completion;
* *gap*: from a completion to the next trigger, what the scheduler adds when the interval has already passed (at
  ``max_concurrent`` 1 only: with more, the next checkpoint need not wait for one to complete).

The coordinator runs as its own process (``app.local.LocalCoordinator``) with the service's default scheduler
settings, on PostgreSQL when an admin URL is given (a fresh database, dropped after) and on SQLite otherwise.

Writes ``triggers.md`` and ``triggers.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from contract.models import EventType


@dataclass
class Settings:
    intervals: tuple[int, ...] = (10, 20, 50, 200)
    """Periodic intervals (ms) measured, one after the other, each on a fresh job."""
    subtasks: int = 4
    seconds: float = 6.0
    """How long each interval is measured."""
    pg_admin_url: str | None = None
    """PostgreSQL to run the coordinator on (a fresh database); None: SQLite."""
    scheduler_tick: float | None = None
    """``OVERTAKE_SCHEDULER_TICK`` for the coordinator; None: the service's default."""
    max_concurrent: tuple[int, ...] = (1, 2)
    """The jobs' ``max_concurrent``: every interval is measured at each, on a job of its own."""


@dataclass
class IntervalRun:
    interval_ms: int
    max_concurrent: int = 1
    triggers: int = 0
    completed: int = 0
    spacing_ms: list[int] = field(default_factory=list)
    duration_ms: list[int] = field(default_factory=list)
    gap_ms: list[int] = field(default_factory=list)

    def pct(self, name: str, q: float) -> float | None:
        return _pct(getattr(self, name), q)

    def fifths(self) -> tuple[float | None, float | None]:
        """The spacing's p50 over the run's first and last fifth of triggers: a cost that grows with the checkpoints
        behind (the job's history) shows as a later fifth slower than the first, though every result is right."""
        n = len(self.spacing_ms) // 5
        if n == 0:
            return None, None
        return _pct(self.spacing_ms[:n], 0.5), _pct(self.spacing_ms[-n:], 0.5)

    def per_second(self, seconds: float) -> float:
        return self.completed / seconds if seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name in ("spacing_ms", "duration_ms", "gap_ms"):
            d[f"{name}_p50"], d[f"{name}_p90"] = self.pct(name, 0.5), self.pct(name, 0.9)
        d["spacing_ms_p50_first_fifth"], d["spacing_ms_p50_last_fifth"] = self.fifths()
        return d


def _pct(values: list[int], q: float) -> float | None:
    xs = sorted(values)
    return float(xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]) if xs else None


def measure_interval(url: str, interval_ms: int, subtasks: int, seconds: float, max_concurrent: int = 1) -> IntervalRun:
    """One job at ``interval_ms``: every checkpoint acknowledged for all subtasks in one batch at its trigger."""
    from client.sync import OvertakeClient

    run = IntervalRun(interval_ms, max_concurrent)
    triggered: dict[int, int] = {}
    completed: dict[int, int] = {}
    with OvertakeClient(url) as admin:
        job = admin.create_job({
            "name": f"trigger-spacing-{interval_ms}-{max_concurrent}-{int(time.time() * 1000)}",
            "graph": {"vertices": [{"id": "v", "parallelism": subtasks}]},
            "checkpoint": {"policy": "unaligned", "retained": 1, "timeout": 60_000, "interval": interval_ms,
                           "max_concurrent": max_concurrent},
        })
        attempt = admin.start_attempt(job.id)
        task = OvertakeClient(url, attempt.task_token)
        follower = OvertakeClient(url, attempt.task_token)
        stop = threading.Event()
        errors: list[BaseException] = []
        ack = {"attempt": attempt.attempt, "vertex": "v", "metrics": {"unaligned": True}}

        def follow() -> None:
            try:
                for ev in follower.events(job.id):
                    if stop.is_set():
                        return
                    if ev.type == EventType.checkpoint_triggered:
                        cp = ev.data["checkpoint_id"]
                        triggered[cp] = ev.data["trigger_timestamp"]
                        task.ack_batch(job.id, cp, [{**ack, "subtask_index": i} for i in range(subtasks)])
                    elif ev.type == EventType.checkpoint_completed:
                        cp = ev.data["checkpoint_id"]
                        if cp in triggered and ev.data.get("end_to_end_duration") is not None:
                            completed[cp] = triggered[cp] + ev.data["end_to_end_duration"]
            except BaseException as e:  # noqa: BLE001 - closing the client ends the stream; anything else is kept
                if not stop.is_set():
                    errors.append(e)

        thread = threading.Thread(target=follow, name="trigger-spacing-player", daemon=True)
        thread.start()
        try:
            for i in range(subtasks):
                task.report_running(job.id, attempt.attempt, "v", i)
            time.sleep(seconds)
        finally:
            stop.set()
            follower.close()
            thread.join(10)
            try:
                admin.finish_job(job.id, "FINISHED", None, attempt=attempt.attempt)
            except Exception:  # noqa: BLE001 - bookkeeping only
                pass
            task.close()
        if errors:
            raise RuntimeError(f"interval {interval_ms} ms: the player failed: {errors[0]!r}") from errors[0]
    ids = sorted(triggered)
    run.triggers, run.completed = len(ids), len(completed)
    # the first trigger of a job counts its interval from the last subtask's running report, not from a trigger
    for a, b in zip(ids, ids[1:], strict=False):
        run.spacing_ms.append(triggered[b] - triggered[a])
        if a in completed and max_concurrent == 1:  # with more, the next may come before this one completed
            run.gap_ms.append(triggered[b] - completed[a])
    run.duration_ms = [completed[c] - triggered[c] for c in ids if c in completed]
    return run


def run(s: Settings, status=lambda msg: None) -> list[IntervalRun]:
    from app.local import LocalCoordinator

    runs: list[IntervalRun] = []
    drop = None
    env = {"OVERTAKE_LOG_LEVEL": "WARNING"}
    if s.pg_admin_url:
        from benchmarks.acks import new_pg_database

        db, drop = new_pg_database(s.pg_admin_url)
        env["OVERTAKE_DATABASE_URL"] = db
    from app.settings import Settings as ServiceSettings

    tick = s.scheduler_tick if s.scheduler_tick is not None else ServiceSettings.model_fields["scheduler_tick"].default
    try:
        with tempfile.TemporaryDirectory(prefix="overtake-bench-triggers-") as tmp:
            coordinator = LocalCoordinator(Path(tmp), env, scheduler_tick=tick).start()
            try:
                for concurrent in s.max_concurrent:
                    for interval in s.intervals:
                        status(f"trigger spacing at {interval} ms, max_concurrent {concurrent}")
                        runs.append(measure_interval(coordinator.url, interval, s.subtasks, s.seconds, concurrent))
            finally:
                coordinator.stop()
    finally:
        if drop is not None:
            drop()
    return runs


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:,.0f} ms"


def markdown(s: Settings, runs: list[IntervalRun], command: str, machine: str) -> str:
    db = "PostgreSQL" if s.pg_admin_url else "SQLite"
    lines = [
        "## Trigger spacing",
        "",
        f"`{command}`; {machine}; the coordinator as its own process on {db}, its default scheduler settings; "
        f"{s.subtasks} subtasks acknowledged in one batch per checkpoint as each trigger arrives, "
        f"{s.seconds:g} s per interval.",
        "",
        "| interval | max_concurrent | checkpoints/s | spacing p50 | p90 | p50, first → last fifth | duration p50 "
        "| completion → next trigger p50 | p90 |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in runs:
        first, last = r.fifths()
        lines.append(
            f"| {r.interval_ms} ms | {r.max_concurrent} | {r.per_second(s.seconds):,.1f} | {_ms(r.pct('spacing_ms', 0.5))} | "
            f"{_ms(r.pct('spacing_ms', 0.9))} | {_ms(first)} → {_ms(last)} | {_ms(r.pct('duration_ms', 0.5))} | "
            f"{_ms(r.pct('gap_ms', 0.5))} | {_ms(r.pct('gap_ms', 0.9))} |"
        )
    lines += [
        "",
        "Reading the first → last fifth: a last fifth slower than the first means something costs more as the "
        "job's checkpoints accumulate.",
    ]
    return "\n".join(lines) + "\n"


def write(s: Settings, runs: list[IntervalRun], out: Path, command: str, machine: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "triggers.json").write_text(json.dumps(
        {"settings": asdict(s), "runs": [r.as_dict() for r in runs]}, indent=2, default=str))
    path = out / "triggers.md"
    path.write_text(markdown(s, runs, command, machine))
    return path


def headline(runs: list[IntervalRun]) -> str:
    return ", ".join(f"{r.interval_ms} ms (max_concurrent {r.max_concurrent}): spacing p50 "
                     f"{_ms(r.pct('spacing_ms', 0.5))}" for r in runs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.trigger_spacing", description=__doc__.split("\n\n")[0])
    p.add_argument("--intervals", default="10,20,50,200", help="comma-separated intervals in ms")
    p.add_argument("--subtasks", type=int, default=4)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--pg", default=None, metavar="ADMIN_URL", help="run the coordinator on PostgreSQL")
    p.add_argument("--tick", type=float, default=None, help="the coordinator's scheduler tick (s)")
    p.add_argument("--max-concurrent", default="1,2", help="comma-separated max_concurrent settings, each measured")
    p.add_argument("--out", default="bench-results")
    a = p.parse_args(argv)
    s = Settings(tuple(int(x) for x in a.intervals.split(",")), a.subtasks, a.seconds, a.pg, a.tick,
                 tuple(int(x) for x in a.max_concurrent.split(",")))
    runs = run(s, lambda m: print(m, file=sys.stderr))
    command = "python -m benchmarks.trigger_spacing " + " ".join(argv if argv is not None else sys.argv[1:])
    path = write(s, runs, Path(a.out), command.strip(), f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the end")
    print(path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

