"""The in-flight budget (``overtake bench budget``, scenario 12): checkpoint duration and persisted in-flight bytes
of unaligned checkpoints without a budget and with per-subtask budgets, under sustained backpressure, in one run.

For each shuffle depth, the backpressured pipeline of scenario 1 (``flip76.backpressured_pipeline``: a fast source,
``depth`` slow keyed stages, a discarding sink) runs for the same time with unaligned checkpoints every interval,
once per budget (none first). A subtask that would persist more than its budget takes that checkpoint aligned: it
persists nothing for it, and its checkpoint takes as long as its alignment does. Reported per run, over the
completed checkpoints after warm-up: duration p50 and p90, persisted bytes per checkpoint (mean and max, all
subtasks), the most one subtask persisted against the budget, and how many subtask acks fell back to aligned.

The check counts the bytes in flight when the subtask decides; what reaches its other channels before their
barriers is persisted too, so one subtask may persist more than its budget by at most what its credit lets in
(``NetworkConfig.inflight_capacity_bytes``). The table shows by how much.

Writes ``budget.md`` and ``budget.json`` into ``--out``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.flip76 import Runner, RunStats
from benchmarks.report import write_scenario
from contract.units import human_bytes

KIB = 1024


@dataclass
class Settings:
    """What the scenario runs; the pipeline's own settings are scenario 1's (``flip76.Settings``)."""

    quick: bool = False
    depths: tuple[int, ...] = (1, 2)
    budgets: tuple[int | None, ...] = (None, 64 * KIB, 256 * KIB)
    """Per-subtask budgets, None: unaligned without a budget."""
    seconds: float = 40.0

    @classmethod
    def quick_settings(cls, **over: Any) -> Settings:
        return cls(**{"quick": True, "seconds": 12.0, **over})

    def runs(self) -> list[tuple[int, int | None]]:
        return [(d, b) for d in self.depths for b in self.budgets]


def budget_label(budget: int | None) -> str:
    return "no budget" if budget is None else f"budget {human_bytes(budget)}"


@dataclass
class SubtaskAck:
    """One subtask's part of a completed checkpoint."""

    persisted: int
    unaligned: bool


@dataclass
class BudgetRun:
    """One budget at one depth."""

    depth: int
    budget: int | None
    stats: RunStats
    acks: list[list[SubtaskAck]] = field(default_factory=list)
    """Per completed checkpoint after warm-up (the latest ones), each subtask's persisted bytes and mode."""

    @property
    def label(self) -> str:
        return f"depth {self.depth}, {budget_label(self.budget)}"

    def summary(self) -> dict[str, Any]:
        return summarize(self.stats.durations_ms, self.stats.persisted_bytes, self.acks, self.budget)


def _pct(xs: list[float], q: float) -> float | None:
    d = sorted(xs)
    return float(d[min(len(d) - 1, int(round(q * (len(d) - 1))))]) if d else None


def summarize(durations_ms: list[int], persisted: list[int], acks: list[list[SubtaskAck]],
              budget: int | None) -> dict[str, Any]:
    """The figures of one run: durations, persisted bytes per checkpoint, the most one subtask persisted and how far
    past the budget, and the share of subtask acks that fell back to aligned."""
    per_subtask = [a.persisted for cp in acks for a in cp]
    all_acks = [a for cp in acks for a in cp]
    most = max(per_subtask, default=None)
    return {
        "completed": len(durations_ms),
        "duration_p50": _pct(durations_ms, 0.5),
        "duration_p90": _pct(durations_ms, 0.9),
        "persisted_avg": statistics.mean(persisted) if persisted else None,
        "persisted_max": max(persisted, default=None),
        "subtask_max": most,
        "subtask_over_budget": None if budget is None or most is None else max(0, most - budget),
        "acks": len(all_acks),
        "fell_back": sum(1 for a in all_acks if not a.unaligned),
    }


def _acks(client: Any, job_id: int, checkpoints: list, limit: int) -> list[list[SubtaskAck]]:
    done = sorted((c for c in checkpoints if c.status.value == "COMPLETED"), key=lambda c: c.id)[1:][-limit:]
    out = []
    for c in done:
        detail = client.get_checkpoint(job_id, c.id)
        out.append([SubtaskAck(st.persisted_data, st.unaligned) for st in detail.subtasks])
    return out


def measure(runner: Runner, s: Settings, done: Callable[[BudgetRun], None] = lambda r: None,
            into: list[BudgetRun] | None = None) -> list[BudgetRun]:
    """Every depth with every budget, one after the other on the runner's Spark session and coordinator."""
    from client.sync import OvertakeClient

    runs = into if into is not None else []
    for depth, budget in s.runs():
        extra = {} if budget is None else {"max_inflight_bytes_per_subtask": budget}
        stats = runner.backpressured("unaligned", depth, scenario="budget", seconds=s.seconds, checkpoint=extra,
                                     label=f"unaligned, {budget_label(budget)}, depth {depth}")
        run = BudgetRun(depth, budget, stats)
        with OvertakeClient(runner.url) as client:
            cps = client.list_checkpoints(stats.job_id, limit=1000).items
            run.acks = _acks(client, stats.job_id, cps, limit=25)
        runs.append(run)
        done(run)
    return runs


# ------------------------------------------------------------------------------------------------ report


def headline(r: BudgetRun) -> str:
    x = r.summary()
    return (f"duration p50 {_ms(x['duration_p50'])}, persisted {human_bytes(x['persisted_avg'], '–')} per "
            f"checkpoint, one subtask at most {human_bytes(x['subtask_max'], '–')}, {x['fell_back']} of "
            f"{x['acks']} acks aligned")


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:,.0f} ms"


def markdown(runs: list[BudgetRun], s: Settings, command: str = "", machine: str = "") -> str:
    head = f"`{command}` — {machine}. " if command or machine else ""
    lines = [
        "## 12. In-flight budget: unaligned checkpoints without and with a per-subtask budget\n",
        f"{head}The backpressured pipeline of scenario 1, {s.seconds:g} s per run, unaligned checkpoints. "
        "*Persisted* is a checkpoint's in-flight data over all subtasks (mean and max over the completed "
        "checkpoints after warm-up); *one subtask, most* is the most a single subtask persisted for one "
        "checkpoint, and *past the budget* by how much it exceeded the budget (data that reached its other channels "
        "after it decided, bounded by their credit); *fell back* counts subtask acks taken aligned because the "
        "budget would have been passed.\n",
        "| depth | budget per subtask | completed | duration p50 | duration p90 | persisted mean | persisted max | "
        "one subtask, most | past the budget | fell back |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in runs:
        x = r.summary()
        past = "–" if x["subtask_over_budget"] is None else human_bytes(x["subtask_over_budget"])
        lines.append(
            f"| {r.depth} | {'none' if r.budget is None else human_bytes(r.budget)} | {x['completed']} | "
            f"{_ms(x['duration_p50'])} | {_ms(x['duration_p90'])} | {human_bytes(x['persisted_avg'], '–')} | "
            f"{human_bytes(x['persisted_max'], '–')} | {human_bytes(x['subtask_max'], '–')} | {past} | "
            f"{x['fell_back']} of {x['acks']} |"
        )
    return "\n".join(lines) + "\n"


def write(runs: list[BudgetRun], s: Settings, out: Path, command: str = "", machine: str = "") -> str:
    data = {"settings": asdict(s), "runs": [
        {"depth": r.depth, "budget": r.budget, **r.summary(), "stats": r.stats.as_dict()} for r in runs
    ]}
    return write_scenario(out, "budget", markdown(runs, s, command, machine), data)
