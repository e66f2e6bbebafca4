"""Last-barrier checkpoints (``overtake bench last-barrier``, scenario 14): persisted bytes and duration of a
flat_map that emits 100 records per input, first-barrier unaligned against last-barrier (and aligned for reference),
in one run.

The pipeline: a fast source (100-byte payloads) -> rebalance -> a flat_map turning each record into ``fanout``
small ones -> key_by -> a keyed stage spending ``cost_per_input_ms`` per input's worth of outputs (it sleeps on the
first of each input's outputs) -> a discarding sink, every operator at parallelism 2. The keyed stage is the
bottleneck, so the flat_map's output queues and its consumers' input queues fill with its outputs, and its own
input queues with source records.

Reported per policy over the completed checkpoints after warm-up: duration p50 and p90, persisted bytes per
checkpoint, and the same bytes split by side from the channel-state manifest of each retained checkpoint (its
restore plan): *input side* (input channel state), *output side* (output channel state) and, of both, *flat_map
outputs* (the flat_map's output channel state and its consumers' input channel state).

Writes ``last-barrier.md`` and ``last-barrier.json`` into ``--out``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.flip76 import Runner, RunStats
from benchmarks.report import write_scenario
from contract.units import human_bytes
from spark_plugin import Pipeline
from spark_plugin.connectors import DiscardSink, SequenceSource

REGENERATED = "unaligned_last_barrier, regenerated"
"""Last-barrier checkpoints with the flat_map declared deterministic: it logs its inputs and regenerates its outputs
(``spark_plugin.task.regeneration``) instead of its barrier waiting for them to drain."""
POLICIES = ("unaligned", "unaligned_last_barrier", REGENERATED, "aligned")
FLAT = "flat"
SLOW = "slow"


@dataclass
class Settings:
    quick: bool = False
    policies: tuple[str, ...] = POLICIES
    fanout: int = 100
    cost_per_input_ms: float = 4.0
    """The keyed stage's time for the outputs of one source record (0.04 ms per output at a fanout of 100)."""
    payload_bytes: int = 100
    keys: int = 128
    parallelism: int = 2
    interval_ms: int = 1000
    retained: int = 12
    """Checkpoints kept, so that the manifests of this many can be read after the run."""
    seconds: float = 40.0

    @classmethod
    def quick_settings(cls, **over: Any) -> Settings:
        return cls(**{"quick": True, "seconds": 12.0, "retained": 6, **over})

    def spark_tasks(self) -> int:
        return self.parallelism * 3


def _key(record: Any) -> Any:
    return record[0]


def fan_out(fanout: int) -> Callable:
    def flat(record: Any) -> list:
        key, seq = record[0], record[1]
        return [(key, seq, j) for j in range(fanout)]

    return flat


def slow_per_input(cost_s: float) -> Callable:
    def process(key, record, state):
        if record[2] == 0:
            time.sleep(cost_s)
        state.update((state.value() or 0) + 1)
        return [record]

    return process


def flat_map_pipeline(name: str, s: Settings, deterministic: bool = False) -> Pipeline:
    p = Pipeline(name, parallelism=s.parallelism)
    (
        p.source(SequenceSource(keys=s.keys, payload=s.payload_bytes), id="source")
        .rebalance()
        .flat_map(fan_out(s.fanout), id=FLAT, deterministic=deterministic)
        .key_by(_key)
        .process(slow_per_input(s.cost_per_input_ms / 1000.0), id=SLOW)
        .sink(DiscardSink(), id="sink")
    )
    return p


@dataclass
class Sides:
    """One checkpoint's channel state by side, from its manifest."""

    input: int = 0
    output: int = 0
    flat_outputs: int = 0


def sides_of(plan: Any) -> Sides:
    """Split a checkpoint's persisted channel state (its restore plan) into input and output side, and count the
    flat_map's outputs among them: its own output channel state and its consumers' input channel state."""
    s = Sides()
    for st in plan.subtasks:
        for seg in st.input_channel_state:
            s.input += seg.length
            if st.vertex == SLOW:
                s.flat_outputs += seg.length
        for seg in st.output_channel_state:
            s.output += seg.length
            if st.vertex == FLAT:
                s.flat_outputs += seg.length
    return s


@dataclass
class PolicyRun:
    policy: str
    stats: RunStats
    sides: list[Sides] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.policy

    def summary(self) -> dict[str, Any]:
        return summarize(self.stats.durations_ms, self.stats.persisted_bytes, self.sides)


def _pct(xs: list[float], q: float) -> float | None:
    d = sorted(xs)
    return float(d[min(len(d) - 1, int(round(q * (len(d) - 1))))]) if d else None


def _mean(xs: list[int]) -> float | None:
    return statistics.mean(xs) if xs else None


def summarize(durations_ms: list[int], persisted: list[int], sides: list[Sides]) -> dict[str, Any]:
    """Durations p50/p90, mean persisted bytes per checkpoint, and the mean of each side over the checkpoints whose
    manifest was read (with the share of the flat_map's outputs in what they persisted)."""
    total = sum(x.input + x.output for x in sides)
    return {
        "completed": len(durations_ms),
        "duration_p50": _pct(durations_ms, 0.5),
        "duration_p90": _pct(durations_ms, 0.9),
        "persisted_avg": _mean(persisted),
        "manifests": len(sides),
        "input_avg": _mean([x.input for x in sides]),
        "output_avg": _mean([x.output for x in sides]),
        "flat_outputs_avg": _mean([x.flat_outputs for x in sides]),
        "flat_outputs_share": sum(x.flat_outputs for x in sides) / total if total else None,
    }


def measure(runner: Runner, s: Settings, done: Callable[[PolicyRun], None] = lambda r: None,
            into: list[PolicyRun] | None = None) -> list[PolicyRun]:
    """Each policy in turn on the runner's Spark session and coordinator."""
    from client.sync import OvertakeClient

    runs = into if into is not None else []
    for policy in s.policies:
        regenerated = policy == REGENERATED
        stats = runner.run("last-barrier", policy, lambda n, r=regenerated: flat_map_pipeline(n, s, r), SLOW,
                           "unaligned_last_barrier" if regenerated else policy, 1, s.seconds,
                           interval_ms=s.interval_ms, checkpoint={"retained": s.retained})
        run = PolicyRun(policy, stats)
        with OvertakeClient(runner.url) as client:
            cps = client.list_checkpoints(stats.job_id, limit=1000).items
            done_ids = sorted(c.id for c in cps if c.status.value == "COMPLETED")[1:]  # after warm-up
            for cid in done_ids[-s.retained:]:
                try:
                    run.sides.append(sides_of(client.restore_plan(stats.job_id, cid)))
                except Exception:  # noqa: BLE001 - a checkpoint subsumed meanwhile: fewer manifests, said in the table
                    continue
        runs.append(run)
        done(run)
    return runs


# ------------------------------------------------------------------------------------------------ report


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:,.0f} ms"


def _share(v: float | None) -> str:
    return "–" if v is None else f"{v:.0%}"


def headline(r: PolicyRun) -> str:
    x = r.summary()
    return (f"duration p50 {_ms(x['duration_p50'])}, persisted {human_bytes(x['persisted_avg'], '–')} per checkpoint, "
            f"{_share(x['flat_outputs_share'])} of it flat_map outputs")


def markdown(runs: list[PolicyRun], s: Settings, command: str = "", machine: str = "") -> str:
    head = f"`{command}` — {machine}. " if command or machine else ""
    lines = [
        "## 14. Last-barrier checkpoints: a flat_map with 100 outputs per input\n",
        f"{head}source -> rebalance -> flat_map ({s.fanout} outputs per input) -> key_by -> keyed stage "
        f"({s.cost_per_input_ms:g} ms per input's outputs) -> sink, parallelism {s.parallelism}, {s.seconds:g} s per "
        f"policy, checkpoints every {s.interval_ms} ms. *Persisted* is a checkpoint's in-flight data over all "
        "subtasks (mean over the completed checkpoints after warm-up); the sides are means over the checkpoints "
        "whose manifest was read (*manifests*): *input side* and *output side* of the channel state, and *flat_map "
        "outputs*, the part of both that holds the flat_map's outputs.\n",
        "| policy | completed | duration p50 | duration p90 | persisted | manifests | input side | output side | "
        "flat_map outputs | share |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in runs:
        x = r.summary()
        lines.append(
            f"| {r.policy} | {x['completed']} | {_ms(x['duration_p50'])} | {_ms(x['duration_p90'])} | "
            f"{human_bytes(x['persisted_avg'], '–')} | {x['manifests']} | {human_bytes(x['input_avg'], '–')} | "
            f"{human_bytes(x['output_avg'], '–')} | {human_bytes(x['flat_outputs_avg'], '–')} | "
            f"{_share(x['flat_outputs_share'])} |"
        )
    return "\n".join(lines) + "\n"


def write(runs: list[PolicyRun], s: Settings, out: Path, command: str = "", machine: str = "") -> str:
    data = {"settings": asdict(s), "runs": [
        {"policy": r.policy, **r.summary(), "sides": [asdict(x) for x in r.sides], "stats": r.stats.as_dict()}
        for r in runs
    ]}
    return write_scenario(out, "last-barrier", markdown(runs, s, command, machine), data)
