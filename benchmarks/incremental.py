"""Scenario 11: incremental channel state: bytes written per checkpoint under sustained backpressure, with every
in-flight buffer written again at each checkpoint (off) against buffers the previous completed checkpoint already
persisted referenced where they lie (on).

The pipeline is scenario 1's backpressured one (fast source -> key_by -> slow stage -> discarding sink) under the
unaligned policy; both runs take the same time, one after the other in one run. Per run, from its completed
checkpoints after the first (which has nothing to reference): the bytes written into the blob store per checkpoint
(``state_size``: the objects the subtasks wrote, operator state included), the in-flight bytes each checkpoint holds
(``persisted_data``, the same with references or without), and the share of those bytes written again. Written into
``incremental.md`` and ``incremental.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import mean, median
from typing import Any

from benchmarks.report import write_scenario


@dataclass
class IncrementalSettings:
    seconds: float = 40.0
    """Length of each run."""
    depth: int = 1
    interval_ms: int = 1000

    @classmethod
    def quick(cls) -> IncrementalSettings:
        return cls(seconds=15.0)


@dataclass
class IncrementalRun:
    label: str
    incremental: bool
    job_id: int = 0
    completed: int = 0
    """Completed checkpoints counted (the first completed one is left out)."""
    failed: int = 0
    written_per_checkpoint: float | None = None
    """Mean bytes written into the blob store per checkpoint."""
    written_p50: float | None = None
    in_flight_per_checkpoint: float | None = None
    """Mean in-flight bytes a checkpoint holds (persisted_data), whether written or referenced."""
    written_total: int = 0
    records: int = 0
    throughput: float = 0.0


def summarize(label: str, incremental: bool, cps: list[Any]) -> IncrementalRun:
    """The figures of one run from its checkpoints (``Checkpoint`` models, or anything with ``id``, ``status``,
    ``is_savepoint``, ``state_size``, ``persisted_data``)."""
    done = sorted((c for c in cps if c.status.value == "COMPLETED" and not c.is_savepoint), key=lambda c: c.id)
    counted = done[1:]  # the first completed checkpoint has no earlier one to reference
    run = IncrementalRun(label, incremental)
    run.failed = sum(1 for c in cps if c.status.value == "ABORTED" and "job_ended" not in (c.failure_reason or ""))
    run.completed = len(counted)
    if counted:
        written = [c.state_size for c in counted]
        run.written_per_checkpoint = mean(written)
        run.written_p50 = median(written)
        run.in_flight_per_checkpoint = mean(c.persisted_data for c in counted)
        run.written_total = sum(written)
    return run


def reduction(off: IncrementalRun, on: IncrementalRun) -> float | None:
    """How much less is written per checkpoint with incremental channel state (0.75: a quarter of the bytes)."""
    if not off.written_per_checkpoint or on.written_per_checkpoint is None:
        return None
    return 1.0 - on.written_per_checkpoint / off.written_per_checkpoint


def measure(runner: Any, w: IncrementalSettings, status: Callable[[str], None] = lambda m: None) -> list[IncrementalRun]:
    """Both runs with ``runner`` (a ``benchmarks.flip76.Runner``): incremental channel state off, then on."""
    from benchmarks.flip76 import backpressured_pipeline
    from client.sync import OvertakeClient

    out = []
    for incremental in (False, True):
        label = "incremental" if incremental else "everything written"
        status(f"{label}: {w.seconds:.0f} s under backpressure")
        stats = runner.run(
            "incremental", label, lambda n: backpressured_pipeline(n, w.depth, runner.s), f"slow-{w.depth}",
            "unaligned", w.depth, w.seconds, interval_ms=w.interval_ms, incremental=incremental,
        )
        with OvertakeClient(runner.url) as client:
            cps = client.list_checkpoints(stats.job_id, limit=1000).items
        run = summarize(label, incremental, cps)
        run.job_id, run.records, run.throughput = stats.job_id, stats.records, stats.throughput
        out.append(run)
    return out


def _kib(x: float | None) -> str:
    return "—" if x is None else f"{x / 1024:,.0f} KiB"


def markdown(runs: list[IncrementalRun], w: IncrementalSettings, command: str, machine: str) -> str:
    lines = [
        "## 11. Incremental channel state under sustained backpressure",
        "",
        f"`{command}` — {machine}",
        "",
        f"Each run: {w.seconds:.0f} s of scenario 1's backpressured pipeline at depth {w.depth}, unaligned "
        f"checkpoints every {w.interval_ms} ms. Written: the objects the subtasks wrote into the blob store per "
        "checkpoint (operator state included); in flight: the in-flight bytes the checkpoint holds, written or "
        "referenced. The first completed checkpoint of each run is left out.",
        "",
        "| run | completed | failed | written per checkpoint (mean) | written (p50) | in flight per checkpoint "
        "| written in all | records/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in runs:
        lines.append(
            f"| {r.label} | {r.completed} | {r.failed} | {_kib(r.written_per_checkpoint)} | {_kib(r.written_p50)} "
            f"| {_kib(r.in_flight_per_checkpoint)} | {r.written_total / 2**20:,.1f} MiB | {r.throughput:,.0f} |"
        )
    off = next((r for r in runs if not r.incremental), None)
    on = next((r for r in runs if r.incremental), None)
    cut = reduction(off, on) if off and on else None
    if cut is not None:
        lines += ["", f"Incremental channel state writes {cut:.0%} fewer bytes per checkpoint."]
    return "\n".join(lines) + "\n"


def write(runs: list[IncrementalRun], w: IncrementalSettings, out: Path, command: str, machine: str) -> str:
    data = {"settings": asdict(w), "runs": [asdict(r) for r in runs]}
    return write_scenario(out, "incremental", markdown(runs, w, command, machine), data)


def summary(runs: list[IncrementalRun]) -> str:
    return ", ".join(f"{r.label}: {_kib(r.written_per_checkpoint)} written per checkpoint" for r in runs)
