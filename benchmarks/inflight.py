"""No more in flight than needed (``overtake bench inflight``, scenario 8): what each unaligned checkpoint persists
and how long a recovery takes, for three network sizings in one run.

The sizings: *fixed* (Flink's defaults: 32 KiB buffers, 2 exclusive per channel, 8 floating per gate, at most 10
per output channel), *debloated 1 s* and *debloated 0.1 s* (buffer debloating, Flink's FLIP-183: receivers size
their senders' buffers so that the buffers in use hold that much of their throughput). For each shuffle depth and
sizing, one after the other on one Spark session and one coordinator:

1. the backpressured pipeline of scenario 1 (a fast source, ``depth`` slow keyed stages, the last one stamping
   when it processed each record) runs with unaligned checkpoints until ``checkpoints`` of them completed, and is
   left open as a failure would leave it;
2. a new attempt restores its latest checkpoint (``benchmarks.recovery.timed_restore``): the recovery time is from
   submitting it until the last stage processed the last record the sources had emitted by the checkpoint, so the
   restored channel state was replayed and the pipeline caught up.

Reported per run: persisted in-flight bytes per checkpoint (p50 and mean over the checkpoints after warm-up), the
checkpoint duration p50, the in-flight data restored, the records replayed and the recovery time.

Writes ``inflight.md`` and ``inflight.json`` into ``--out``; its section also goes into ``report.md``.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.flip76 import RunStats, checkpoint_stats, slow_stage
from contract.units import human_bytes
from spark_plugin import Pipeline
from spark_plugin.network.config import NetworkConfig


def sizings() -> dict[str, NetworkConfig]:
    """The three sizings compared, by name, in the order they run."""
    return {
        "fixed": NetworkConfig(),
        "debloated 1 s": NetworkConfig(debloat_target_s=1.0),
        "debloated 0.1 s": NetworkConfig(debloat_target_s=0.1),
    }


@dataclass
class Settings:
    """Everything a run depends on; written into the report as it is."""

    quick: bool = False
    depths: tuple[int, ...] = (1, 2)
    parallelism: int = 2
    checkpoints: int = 20
    """Completed checkpoints before the run is stopped and restored (the first one is warm-up)."""
    interval_ms: int = 1000
    record_cost_ms: float = 1.0
    payload_bytes: int = 100
    keys: int = 128

    @classmethod
    def quick_settings(cls, **over: Any) -> Settings:
        return cls(**{"quick": True, "checkpoints": 8, **over})

    def spark_tasks(self) -> int:
        return self.parallelism * (max(self.depths) + 1)


# ------------------------------------------------------------------------------------------------ pipeline


def _key(record: Any) -> Any:
    return record[0]


def stamped_stage(cost_s: float) -> Callable:
    """The last slow stage: as ``flip76.slow_stage``, and emits ``(key, seq, processed_at)``."""
    slow = slow_stage(cost_s)

    def process(key, record, state):
        slow(key, record, state)
        return [(record[0], record[1], time.time())]

    return process


def pipeline(name: str, depth: int, s: Settings, count: int | None = None) -> Pipeline:
    """source (``count`` records, None: unbounded) -> (key_by -> slow stage) x depth -> collecting sink."""
    from spark_plugin.connectors import CollectSink, SequenceSource

    p = Pipeline(name, parallelism=s.parallelism)
    stream = p.source(SequenceSource(count=count, keys=s.keys, payload=s.payload_bytes), id="source")
    for d in range(1, depth + 1):
        stage = stamped_stage if d == depth else slow_stage
        stream = stream.key_by(_key).process(stage(s.record_cost_ms / 1000.0), id=f"slow-{d}")
    stream.sink(CollectSink(), id="sink")
    return p


# ------------------------------------------------------------------------------------------------ one run


@dataclass
class InflightRun:
    """One sizing at one depth: its checkpoints, then its recovery."""

    sizing: str
    depth: int
    stats: RunStats
    restored_checkpoint: int | None = None
    restored_bytes: int = 0
    replayed_records: int = 0
    recovery_s: float | None = None
    replay_s: float | None = None
    """Of the recovery: from the new attempt's first processed record until it caught up."""

    @property
    def persisted_p50(self) -> float | None:
        return float(statistics.median(self.stats.persisted_bytes)) if self.stats.persisted_bytes else None

    @property
    def persisted_avg(self) -> float | None:
        return self.stats.persisted_avg

    def as_dict(self) -> dict[str, Any]:
        return {"sizing": self.sizing, "depth": self.depth, "stats": self.stats.as_dict(),
                "persisted_p50": self.persisted_p50, "persisted_avg": self.persisted_avg,
                "restored_checkpoint": self.restored_checkpoint, "restored_bytes": self.restored_bytes,
                "replayed_records": self.replayed_records, "recovery_s": self.recovery_s,
                "replay_s": self.replay_s}


@dataclass
class InflightResult:
    settings: dict[str, Any]
    runs: list[InflightRun] = field(default_factory=list)

    def run(self, sizing: str, depth: int) -> InflightRun | None:
        return next((r for r in self.runs if r.sizing == sizing and r.depth == depth), None)


def measure_one(spark: Any, url: str, s: Settings, depth: int, sizing: str, network: NetworkConfig,
                status: Callable[[str], None] = lambda m: None) -> InflightRun:
    """Checkpoints of the backpressured pipeline with ``network`` until ``s.checkpoints`` completed, then a timed
    recovery from the latest one."""
    from benchmarks.recovery import timed_restore
    from client.sync import OvertakeClient
    from contract.models import CheckpointConfig
    from spark_plugin.driver.run import run_pipeline

    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"bench-inflight-{sizing}-depth{depth}-{int(time.time())}")
    config = CheckpointConfig(interval=s.interval_ms, policy="unaligned", retained=2, timeout=600_000)
    status(f"{sizing}, depth {depth}: until {s.checkpoints} checkpoints completed")
    started = time.monotonic()
    first = run_pipeline(pipeline(name, depth, s), spark, url, checkpoint=config, network=network,
                         stop_after_checkpoints=s.checkpoints, finish=False)
    ended = int(time.time() * 1000)
    stats = RunStats("inflight", sizing, "unaligned", depth, time.monotonic() - started, job_id=first.job_id,
                     wall_seconds=time.monotonic() - started)
    with OvertakeClient(url) as client:
        checkpoint_stats(stats, client.list_checkpoints(first.job_id, limit=1000).items, ended)
    run = InflightRun(sizing, depth, stats)
    status(f"{sizing}, depth {depth}: recovery from the latest checkpoint")
    restored = timed_restore(spark, url, first.job_id, lambda count: pipeline(name, depth, s, count),
                             source="source", sink="sink", checkpoint=config, network=network)
    run.restored_checkpoint = restored.checkpoint_id
    run.restored_bytes = restored.restored_bytes
    run.replayed_records = restored.replayed_records
    run.recovery_s = restored.seconds
    run.replay_s = restored.replay_seconds
    return run


def measure(spark: Any, url: str, s: Settings, status: Callable[[str], None] = lambda m: None,
            done: Callable[[InflightRun], None] = lambda r: None, into: InflightResult | None = None) -> InflightResult:
    """Every depth with every sizing, in one run; ``done`` is called after each (with the runs so far in
    ``into``, when given, so a report written then holds them)."""
    nets = sizings()
    result = into if into is not None else InflightResult(settings={})
    result.settings = {**asdict(s), "sizings": {k: asdict(v) for k, v in nets.items()}}
    for depth in s.depths:
        for sizing, net in nets.items():
            run = measure_one(spark, url, s, depth, sizing, net, status)
            result.runs.append(run)
            done(run)
    return result


# ------------------------------------------------------------------------------------------------ report


def _ratio(a: float | None, b: float | None) -> str:
    return "–" if a is None or not b else f"{a / b:.2f}×"


def _s(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f} s"


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:,.0f} ms"


def markdown(r: InflightResult, command: str = "", machine: str = "") -> str:
    s = r.settings
    lines = ["## 8. In flight: fixed buffers against buffer debloating\n"]
    head = f"`{command}` — {machine}. " if command or machine else ""
    lines.append(
        f"{head}The backpressured pipeline (a fast source, `depth` slow keyed stages of {s['record_cost_ms']:g} ms "
        f"per record, parallelism {s['parallelism']}, {s['payload_bytes']} B payload per record), unaligned "
        f"checkpoints every {s['interval_ms']} ms until {s['checkpoints']} completed; then a new attempt restores "
        "the latest one. *Persisted* is the in-flight data (input and output channel state) of a checkpoint, over "
        "the checkpoints after warm-up; *recovery* is from submitting the new attempt (Spark's stage start "
        "included) until the last stage processed the last record emitted before the checkpoint, *of which "
        "replay* from the first record the new attempt processed. Ratios are against the fixed sizing at the "
        "same depth.\n"
    )
    lines += ["| depth | sizing | persisted p50 | persisted mean | vs fixed | checkpoint p50 | completed | "
              "in flight restored | records replayed | recovery | of which replay | vs fixed |",
              "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for x in r.runs:
        base = r.run("fixed", x.depth)
        lines.append(
            f"| {x.depth} | {x.sizing} | {human_bytes(x.persisted_p50, '–')} | {human_bytes(x.persisted_avg, '–')} | "
            f"{_ratio(x.persisted_avg, base.persisted_avg if base else None)} | {_ms(x.stats.p50)} | "
            f"{x.stats.completed} | {human_bytes(x.restored_bytes, '–')} | {x.replayed_records:,} | "
            f"{_s(x.recovery_s)} | {_s(x.replay_s)} | {_ratio(x.recovery_s, base.recovery_s if base else None)} |"
        )
    return "\n".join(lines) + "\n"


def summary(r: InflightResult) -> str:
    parts = [f"depth {x.depth} {x.sizing}: {human_bytes(x.persisted_avg, '–')} per checkpoint, recovery "
             f"{'–' if x.recovery_s is None else f'{x.recovery_s:.1f} s'}" for x in r.runs]
    return "; ".join(parts) if parts else "no runs"


def write(r: InflightResult, out: Path, command: str = "", machine: str = "") -> str:
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(r, command, machine)
    (out / "inflight.md").write_text(text)
    data = {"settings": r.settings, "runs": [x.as_dict() for x in r.runs]}
    (out / "inflight.json").write_text(json.dumps(data, indent=2, default=str))
    return text
