"""Concurrent unaligned checkpoints (``overtake bench concurrent``, scenario 13): ``max_concurrent`` 1 against 2 with
a checkpoint interval shorter than a checkpoint takes, under sustained backpressure, in one run.

The backpressured pipeline of scenario 1 (``flip76.backpressured_pipeline``) runs for the same time with unaligned
checkpoints every ``interval_ms``, once per ``max_concurrent``. With 1, the coordinator triggers no checkpoint while
one is pending, so a checkpoint that takes longer than the interval delays the next; with 2, a subtask keeps two in
progress, each with its own channel-state recording. The interval is 20 ms at depth 2: unaligned checkpoints of this
pipeline take some 20-40 ms, so at 200 ms they never overlap and both settings measure the same thing. Reported per
run, over the checkpoints after warm-up: checkpoints completed per minute, duration p50 and p90, how many were
aborted (a subtask declined them, or they timed out), and the throughput.

Writes ``concurrent.md`` and ``concurrent.json`` into ``--out``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.flip76 import Runner, RunStats, backpressured_pipeline
from benchmarks.report import write_scenario


@dataclass
class Settings:
    """What the scenario runs; the pipeline's own settings are scenario 1's (``flip76.Settings``)."""

    quick: bool = False
    depth: int = 2
    interval_ms: int = 20
    concurrency: tuple[int, ...] = (1, 2)
    seconds: float = 40.0

    @classmethod
    def quick_settings(cls, **over: Any) -> Settings:
        return cls(**{"quick": True, "seconds": 12.0, **over})


@dataclass
class ConcurrentRun:
    """One ``max_concurrent`` value."""

    max_concurrent: int
    stats: RunStats

    @property
    def label(self) -> str:
        return f"max_concurrent {self.max_concurrent}"

    def summary(self) -> dict[str, Any]:
        return summarize(self.stats.completed, self.stats.aborted, self.stats.durations_ms, self.stats.seconds)


def _pct(xs: list[int], q: float) -> float | None:
    d = sorted(xs)
    return float(d[min(len(d) - 1, int(round(q * (len(d) - 1))))]) if d else None


def summarize(completed: int, aborted: int, durations_ms: list[int], seconds: float) -> dict[str, Any]:
    """The figures of one run: completed checkpoints per minute of the run, duration p50 and p90, aborted count."""
    return {
        "completed": completed,
        "per_minute": completed * 60.0 / seconds if seconds > 0 else None,
        "duration_p50": _pct(durations_ms, 0.5),
        "duration_p90": _pct(durations_ms, 0.9),
        "aborted": aborted,
    }


def measure(runner: Runner, s: Settings, done: Callable[[ConcurrentRun], None] = lambda r: None,
            into: list[ConcurrentRun] | None = None) -> list[ConcurrentRun]:
    """Every ``max_concurrent`` value, one after the other on the runner's Spark session and coordinator."""
    runs = into if into is not None else []
    for k in s.concurrency:
        stats = runner.run(
            "concurrent", f"unaligned, max_concurrent {k}, depth {s.depth}",
            lambda n: backpressured_pipeline(n, s.depth, runner.s), f"slow-{s.depth}", "unaligned", s.depth,
            s.seconds, interval_ms=s.interval_ms, checkpoint={"max_concurrent": k},
        )
        run = ConcurrentRun(k, stats)
        runs.append(run)
        done(run)
    return runs


# ------------------------------------------------------------------------------------------------ report


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:,.0f} ms"


def headline(r: ConcurrentRun) -> str:
    x = r.summary()
    per_min = "–" if x["per_minute"] is None else f"{x['per_minute']:.0f}"
    return f"{per_min} completed per minute, duration p50 {_ms(x['duration_p50'])}, {x['aborted']} aborted"


def markdown(runs: list[ConcurrentRun], s: Settings, command: str = "", machine: str = "") -> str:
    head = f"`{command}` — {machine}. " if command or machine else ""
    lines = [
        "## 13. Concurrent unaligned checkpoints: max_concurrent 1 against 2\n",
        f"{head}The backpressured pipeline of scenario 1 at depth {s.depth}, {s.seconds:g} s per run, unaligned "
        f"checkpoints every {s.interval_ms} ms. *Per minute* counts the checkpoints completed after warm-up over "
        "the run's length; *aborted* the checkpoints after warm-up that a subtask declined or that timed out; "
        "*records/s* the pipeline's throughput in the same run.\n",
        "| max_concurrent | completed | per minute | duration p50 | duration p90 | aborted | records/s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in runs:
        x = r.summary()
        per_min = "–" if x["per_minute"] is None else f"{x['per_minute']:.1f}"
        lines.append(
            f"| {r.max_concurrent} | {x['completed']} | {per_min} | {_ms(x['duration_p50'])} | "
            f"{_ms(x['duration_p90'])} | {x['aborted']} | {r.stats.throughput:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def write(runs: list[ConcurrentRun], s: Settings, out: Path, command: str = "", machine: str = "") -> str:
    data = {"settings": asdict(s), "runs": [
        {"max_concurrent": r.max_concurrent, **r.summary(), "stats": r.stats.as_dict()} for r in runs
    ]}
    return write_scenario(out, "concurrent", markdown(runs, s, command, machine), data)
