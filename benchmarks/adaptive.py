"""Scenario 9: the adaptive policy against the fixed ones, on a workload whose backpressure comes and goes.

The pipeline: rate-limited sources -> (key_by -> keyed stage) x depth -> discarding sink. Each keyed stage costs
``calm_cost_ms`` per record in calm phases, which it keeps up with easily, and ``busy_cost_ms`` in busy phases, when
it cannot keep up with the sources and backpressure builds until the phase ends and the queues drain. The phases
follow the wall clock (``period_s`` per calm + busy pair), so every subtask and the report agree on them.

Every policy runs the same pipeline for the same time, one after another in one run; reported per policy:
checkpoints completed and failed, the p50 checkpoint duration of checkpoints triggered in busy and in calm phases,
the in-flight bytes persisted (total and per checkpoint), the throughput, and for the adaptive policy what it chose
in each phase. Written into ``adaptive.md`` and ``adaptive.json``.
"""

from __future__ import annotations

import re
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.report import write_scenario
from spark_plugin import Pipeline
from spark_plugin.connectors import DiscardSink, SequenceSource

POLICIES = ("aligned", "unaligned", "aligned_then_unaligned", "adaptive")


@dataclass
class WaveSettings:
    seconds: float = 48.0
    """Length of each policy's run."""
    period_s: float = 12.0
    """One calm phase and one busy phase."""
    busy_share: float = 0.5
    rate: float = 250.0
    """Records per second per source subtask."""
    calm_cost_ms: float = 0.2
    busy_cost_ms: float = 8.0
    depth: int = 2
    parallelism: int = 2
    keys: int = 128
    payload_bytes: int = 512
    interval_ms: int = 1000
    alignment_timeout_ms: int = 200
    """aligned_then_unaligned's timeout and the adaptive policy's alignment budget."""
    policies: tuple[str, ...] = POLICIES
    unbounded: tuple[str, ...] = ("unaligned",)
    """Policies run a second time without the sender's credit bound (``NetworkConfig(output_backlog_buffers=None)``:
    an output channel queues up to 10 buffers whatever its credit), to show what the bound costs or saves."""

    @classmethod
    def quick(cls) -> WaveSettings:
        return cls(seconds=24.0, period_s=8.0)


def phase_at(t_s: float, period_s: float, busy_share: float) -> str:
    """'busy' or 'calm' at wall-clock time ``t_s`` (seconds since the epoch): each period starts calm."""
    return "busy" if (t_s % period_s) >= period_s * (1.0 - busy_share) else "calm"


def wave_stage(w: WaveSettings) -> Callable:
    """A keyed count that costs calm_cost_ms or busy_cost_ms per record, by the phase of the wall clock."""
    calm, busy, period, share = w.calm_cost_ms / 1000.0, w.busy_cost_ms / 1000.0, w.period_s, w.busy_share

    def process(key, record, state):
        time.sleep(busy if phase_at(time.time(), period, share) == "busy" else calm)
        state.update((state.value() or 0) + 1)
        return [record]

    return process


def wave_pipeline(name: str, w: WaveSettings) -> Pipeline:
    p = Pipeline(name, parallelism=w.parallelism)
    stream = p.source(SequenceSource(rate=w.rate, keys=w.keys, payload=w.payload_bytes), id="source")
    for d in range(1, w.depth + 1):
        stream = stream.key_by(lambda r: r[0]).process(wave_stage(w), id=f"wave-{d}")
    stream.sink(DiscardSink(), id="sink")
    return p


def tasks_needed(w: WaveSettings) -> int:
    return w.parallelism * (w.depth + 1)


@dataclass
class PolicyRun:
    policy: str
    job_id: int | None = None
    records: int = 0
    throughput: float = 0.0
    completed: int = 0
    failed: int = 0
    unfinished: int = 0
    p50_busy_ms: float | None = None
    p50_calm_ms: float | None = None
    p90_ms: float | None = None
    persisted_total: int = 0
    persisted_per_checkpoint: float | None = None
    persisted_busy: float | None = None
    """Mean persisted bytes of the completed checkpoints triggered in busy phases."""
    persisted_calm: float | None = None
    unaligned_share: float | None = None
    """Share of completed checkpoints that persisted in-flight data (started unaligned or switched)."""
    choices: dict[str, int] = field(default_factory=dict)
    """For the adaptive policy: '<phase>: <chosen policy>' -> checkpoints."""
    p50_by_choice: dict[str, float] = field(default_factory=dict)
    """For the adaptive policy: '<phase>: <chosen policy>' -> p50 duration of those that completed (ms)."""
    reasons: list[str] = field(default_factory=list)


def _p(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return float(xs[min(len(xs) - 1, int(q * len(xs)))])


def summarize(policy: str, checkpoints: list, w: WaveSettings) -> PolicyRun:
    """One policy's figures from its checkpoints (models of the coordinator's API), after the first completed one
    (it waited for Spark to start the tasks). Checkpoints cut short by the end of the run are unfinished, not failed."""
    run = PolicyRun(policy)
    ordered = sorted((c for c in checkpoints if not c.is_savepoint), key=lambda c: c.id)
    first = next((c.id for c in ordered if c.status.value == "COMPLETED"), None)
    steady = [c for c in ordered if first is not None and c.id > first]
    done = [c for c in steady if c.status.value == "COMPLETED"]
    run.completed = len(done)
    run.unfinished = sum(1 for c in steady if c.status.value == "PENDING" or "job_ended" in (c.failure_reason or ""))
    run.failed = sum(1 for c in steady if c.status.value == "ABORTED") - sum(
        1 for c in steady if c.status.value == "ABORTED" and "job_ended" in (c.failure_reason or ""))

    def phase(c) -> str:
        return phase_at(c.trigger_timestamp / 1000.0, w.period_s, w.busy_share)

    durations = {"busy": [], "calm": []}
    persisted: dict[str, list[int]] = {"busy": [], "calm": []}
    for c in done:
        persisted[phase(c)].append(c.persisted_data)
        if c.end_to_end_duration is not None:
            durations[phase(c)].append(float(c.end_to_end_duration))
    run.persisted_busy = statistics.mean(persisted["busy"]) if persisted["busy"] else None
    run.persisted_calm = statistics.mean(persisted["calm"]) if persisted["calm"] else None
    run.p50_busy_ms = _p(durations["busy"], 0.5)
    run.p50_calm_ms = _p(durations["calm"], 0.5)
    run.p90_ms = _p(durations["busy"] + durations["calm"], 0.9)
    run.persisted_total = sum(c.persisted_data for c in done)
    run.persisted_per_checkpoint = run.persisted_total / len(done) if done else None
    run.unaligned_share = (sum(1 for c in done if c.checkpoint_type.value == "unaligned") / len(done)) if done else None
    decided = [c for c in steady if getattr(c, "decision", None) is not None]
    run.choices = dict(Counter(f"{phase(c)}: {c.decision.chosen.value}" for c in decided))
    by_choice: dict[str, list[float]] = {}
    for c in decided:
        if c.status.value == "COMPLETED" and c.end_to_end_duration is not None:
            by_choice.setdefault(f"{phase(c)}: {c.decision.chosen.value}", []).append(float(c.end_to_end_duration))
    run.p50_by_choice = {k: _p(v, 0.5) for k, v in by_choice.items()}
    reasons = Counter(re.sub(r"\d[\d.,]*", "N", c.decision.reason) for c in decided)
    run.reasons = [f"{n}× {r}" for r, n in reasons.most_common(5)]
    return run


def measure(runner: Any, w: WaveSettings, status: Callable[[str], None] = lambda m: None) -> list[PolicyRun]:
    """Runs every policy on the wave pipeline with ``runner`` (a ``benchmarks.flip76.Runner``)."""
    from client.sync import OvertakeClient
    from spark_plugin.network.config import NetworkConfig

    out = []
    variants = [(p, None) for p in w.policies] + [(p, NetworkConfig(output_backlog_buffers=None))
                                                  for p in w.unbounded if p in w.policies]
    for policy, network in variants:
        label = policy if network is None else f"{policy}, no credit bound"
        status(f"{label}: {w.seconds:.0f} s of waves ({w.period_s:.0f} s periods)")
        stats = runner.run("adaptive", label, lambda n: wave_pipeline(n, w), f"wave-{w.depth}", policy, w.depth,
                           w.seconds, network=network, interval_ms=w.interval_ms,
                           alignment_timeout_ms=w.alignment_timeout_ms)
        with OvertakeClient(runner.url) as client:
            cps = client.list_checkpoints(stats.job_id, limit=1000).items
        run = summarize(label, cps, w)
        run.job_id, run.records, run.throughput = stats.job_id, stats.records, stats.throughput
        out.append(run)
    return out


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f} ms"


def _kib(x: float | None) -> str:
    return "—" if x is None else f"{x / 1024:,.0f} KiB"


def markdown(runs: list[PolicyRun], w: WaveSettings, command: str, machine: str) -> str:
    lines = [
        "## 9. The adaptive policy on backpressure that comes and goes",
        "",
        f"`{command}` — {machine}",
        "",
        f"Each policy ran {w.seconds:.0f} s of a depth-{w.depth} pipeline at parallelism {w.parallelism}: sources at "
        f"{w.rate:.0f} records/s per subtask ({w.payload_bytes} B payload), keyed stages costing "
        f"{w.calm_cost_ms} ms per record in calm phases and {w.busy_cost_ms} ms in busy ones "
        f"({w.period_s:.0f} s periods, {w.busy_share:.0%} busy), checkpoints every {w.interval_ms} ms; "
        f"aligned_then_unaligned's timeout and the adaptive budget: {w.alignment_timeout_ms} ms.",
        "",
        "| policy | completed | failed | p50 busy | p50 calm | p90 | persisted per checkpoint | persisted in all "
        "| checkpoints with in-flight data | records/s | persisted per checkpoint, busy / calm |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in runs:
        share = "—" if r.unaligned_share is None else f"{r.unaligned_share:.0%}"
        lines.append(
            f"| {r.policy} | {r.completed} | {r.failed} | {_ms(r.p50_busy_ms)} | {_ms(r.p50_calm_ms)} "
            f"| {_ms(r.p90_ms)} | {_kib(r.persisted_per_checkpoint)} | {r.persisted_total / 2**20:,.1f} MiB "
            f"| {share} | {r.throughput:,.0f} | {_kib(r.persisted_busy)} / {_kib(r.persisted_calm)} |"
        )
    for r in runs:
        if r.choices:
            lines += ["", f"What `{r.policy}` chose, by the phase its checkpoints were triggered in (p50 duration of "
                      "those that completed): " + ", ".join(
                          f"{k} × {v} ({_ms(r.p50_by_choice.get(k))})" for k, v in sorted(r.choices.items())) + ".", ""]
            lines += [f"- {reason}" for reason in r.reasons]
    return "\n".join(lines) + "\n"


def write(runs: list[PolicyRun], w: WaveSettings, out: Path, command: str, machine: str) -> str:
    data = {"settings": asdict(w), "runs": [asdict(r) for r in runs]}
    return write_scenario(out, "adaptive", markdown(runs, w, command, machine), data)


def summary(runs: list[PolicyRun]) -> str:
    return ", ".join(
        f"{r.policy}: p50 busy {_ms(r.p50_busy_ms)}, {_kib(r.persisted_per_checkpoint)}/checkpoint" for r in runs
    )
