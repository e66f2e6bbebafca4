"""The FLIP-76 test plan as measurements: the pipelines, the runs and the statistics of scenarios 1-3.

Scenario 4 (channel-state write bandwidth) lives in :mod:`benchmarks.disk`, scenario 5 (coordinator ack
throughput) in :mod:`benchmarks.acks`; the report in :mod:`benchmarks.report`; the command line and the progress
display in :mod:`benchmarks.cli`.
"""

from __future__ import annotations

import os
import re
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from spark_plugin import Pipeline
from spark_plugin.connectors import DiscardSink, SequenceSource
from spark_plugin.network.config import NetworkConfig

POLICIES = ("aligned", "unaligned", "aligned_then_unaligned")


@dataclass
class Settings:
    """Everything a run depends on; written into the report as it is."""

    quick: bool = False
    parallelism: int = 2
    depths: tuple[int, ...] = (1, 2, 3)
    policies: tuple[str, ...] = POLICIES
    alignment_timeout_ms: int = 100
    interval_ms: int = 1000
    record_cost_ms: float = 1.0
    payload_bytes: int = 100
    keys: int = 128
    skew: float = 0.0
    backpressure_seconds: float = 40.0
    """Length of each run of scenarios 1 and 2 (counted from the moment all Spark tasks are up)."""
    no_backpressure_seconds: float = 15.0
    no_backpressure_repeats: int = 3
    """Scenario 3 alternates runs without and with checkpoints this many times each."""
    disk_total_mib: int = 512
    disk_repeats: int = 3
    disk_writers: int = 4
    """Subtasks writing channel state at once in the disk scenario (a depth-1 pipeline at parallelism 2 has 4)."""
    ack_path_rounds: int = 20
    """Checkpoints of the ack-path floor measurement (per depth: as many subtasks as that pipeline has)."""
    ack_subtasks: int = 2000
    ack_checkpoints: int = 10
    pg_admin_url: str = "postgresql://postgres@127.0.0.1:5432/postgres"

    @classmethod
    def quick_settings(cls, **over: Any) -> Settings:
        base = dict(
            quick=True, backpressure_seconds=10.0, no_backpressure_seconds=6.0, no_backpressure_repeats=1,
            disk_total_mib=64, disk_repeats=1, ack_subtasks=500, ack_checkpoints=3, ack_path_rounds=6,
        )
        base.update(over)
        return cls(**base)

    def network(self) -> NetworkConfig:
        return NetworkConfig()

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["network"] = asdict(self.network())
        return d


# ------------------------------------------------------------------------------------------------ pipelines


def _key(record: Any) -> Any:
    return record[0]


def slow_stage(cost_s: float) -> Callable:
    """A keyed process function that spends ``cost_s`` seconds per record (sleeping) and counts per key."""

    def process(key, record, state):
        time.sleep(cost_s)
        state.update((state.value() or 0) + 1)
        return [record]

    return process


def light_stage(key, record, state):
    """The same keyed count without the sleep: the stage of the pipeline without backpressure."""
    state.update((state.value() or 0) + 1)
    return [record]


def backpressured_pipeline(name: str, depth: int, s: Settings) -> Pipeline:
    """fast source -> (key_by -> slow stage) x depth -> discarding sink, every operator at ``s.parallelism``."""
    p = Pipeline(name, parallelism=s.parallelism)
    stream = p.source(SequenceSource(keys=s.keys, skew=s.skew, payload=s.payload_bytes), id="source")
    for d in range(1, depth + 1):
        stream = stream.key_by(_key).process(slow_stage(s.record_cost_ms / 1000.0), id=f"slow-{d}")
    stream.sink(DiscardSink(), id="sink")
    return p


def free_pipeline(name: str, s: Settings) -> Pipeline:
    """fast source -> key_by -> keyed count (no sleep) -> discarding sink: runs as fast as the CPUs allow."""
    p = Pipeline(name, parallelism=s.parallelism)
    (
        p.source(SequenceSource(keys=s.keys, skew=s.skew, payload=s.payload_bytes), id="source")
        .key_by(_key)
        .process(light_stage, id="count")
        .sink(DiscardSink(), id="sink")
    )
    return p


def spark_tasks_needed(s: Settings) -> int:
    return s.parallelism * (max(s.depths) + 1)


# ------------------------------------------------------------------------------------------------ one run


@dataclass
class RunStats:
    """One pipeline run: its throughput and the statistics of its checkpoints after warm-up."""

    scenario: str
    label: str
    policy: str | None
    depth: int
    seconds: float
    job_id: int = 0
    records: int = 0
    """Records that entered the last stage (the slow stage, or the keyed count)."""
    throughput: float = 0.0
    warm_up: int = 0
    checkpoints: int = 0
    completed: int = 0
    aborted: int = 0
    unfinished: int = 0
    durations_ms: list[int] = field(default_factory=list)
    persisted_bytes: list[int] = field(default_factory=list)
    unfinished_age_ms: int | None = None
    """Age, when the run ended, of the oldest checkpoint still pending then: a lower bound of its duration."""
    abort_reasons: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0
    coordinator_cpu_s: float | None = None
    """CPU seconds the coordinator process used during the run (user + system, from /proc)."""
    breakdown: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per vertex, medians over completed checkpoints after warm-up of its subtasks' ack metrics (ms): ``ack``
    (trigger to ack recorded), ``start_delay`` (trigger to first barrier), ``alignment`` (first to last input
    barrier), ``sync`` (snapshot), ``async`` (blob uploads + ack request)."""

    def pct(self, q: float) -> float | None:
        d = sorted(self.durations_ms)
        if not d:
            return None
        return float(d[min(len(d) - 1, int(round(q * (len(d) - 1))))])

    @property
    def p50(self) -> float | None:
        return float(statistics.median(self.durations_ms)) if self.durations_ms else None

    @property
    def p90(self) -> float | None:
        return self.pct(0.9)

    @property
    def max(self) -> float | None:
        return float(max(self.durations_ms)) if self.durations_ms else None

    @property
    def p50_or_bound(self) -> tuple[float | None, bool]:
        """The p50, or when nothing completed after warm-up, the lower bound given by the unfinished one."""
        if self.p50 is not None:
            return self.p50, False
        if self.unfinished_age_ms is not None:
            return float(self.unfinished_age_ms), True
        return None, False

    @property
    def persisted_avg(self) -> float | None:
        return statistics.mean(self.persisted_bytes) if self.persisted_bytes else None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(p50=self.p50, p90=self.p90, max=self.max, persisted_avg=self.persisted_avg)
        return d


def checkpoint_stats(stats: RunStats, checkpoints: list, ended_ms: int) -> RunStats:
    """Fill ``stats`` from the run's checkpoints.

    Warm-up: the checkpoints up to and including the first completed one are left out (they waited for Spark to
    start the tasks, as in the demo). Checkpoints still pending when the run ended (aborted with ``job_ended``)
    are counted as unfinished, not as aborted; the oldest one's age gives a lower bound of its duration.
    """
    ordered = sorted(checkpoints, key=lambda c: c.id)
    first_done = next((c.id for c in ordered if c.status.value == "COMPLETED"), None)
    if first_done is None:
        steady = ordered  # nothing completed at all: every checkpoint is still pending at the end
        stats.warm_up = 0
    else:
        steady = [c for c in ordered if c.id > first_done]
        stats.warm_up = len(ordered) - len(steady)
    unfinished = [c for c in steady if c.status.value == "PENDING" or "job_ended" in (c.failure_reason or "")]
    done = [c for c in steady if c.status.value == "COMPLETED"]
    aborted = [c for c in steady if c.status.value == "ABORTED" and c not in unfinished]
    stats.checkpoints = len(steady)
    stats.completed = len(done)
    stats.aborted = len(aborted)
    stats.unfinished = len(unfinished)
    stats.abort_reasons = sorted({(c.failure_reason or "")[:120] for c in aborted})
    stats.durations_ms = [c.end_to_end_duration for c in done if c.end_to_end_duration is not None]
    stats.persisted_bytes = [c.persisted_data for c in done]
    if unfinished:
        # a checkpoint triggered before the tasks were up has been in the pipeline for at most the run's length
        age = ended_ms - min(c.trigger_timestamp for c in unfinished)
        stats.unfinished_age_ms = int(max(0, min(age, stats.seconds * 1000)))
    return stats


def ack_breakdown(client: Any, job_id: int, checkpoints: list, stats: RunStats, limit: int = 25) -> dict:
    """Where a checkpoint's time goes, per vertex, from the subtasks' own ack metrics (medians, ms)."""
    done = sorted((c for c in checkpoints if c.status.value == "COMPLETED"), key=lambda c: c.id)
    done = [c for c in done if c.id > done[0].id][-limit:] if done else []  # the first one is warm-up
    per: dict[str, dict[str, list[float]]] = {}
    for c in done:
        try:
            detail = client.get_checkpoint(job_id, c.id)
        except Exception:  # noqa: BLE001 - the breakdown is extra information
            continue
        for st in detail.subtasks:
            m = per.setdefault(st.vertex, {"ack": [], "start_delay": [], "alignment": [], "sync": [], "async": []})
            m["ack"].append(st.ack_timestamp - c.trigger_timestamp)
            m["start_delay"].append(st.start_delay)
            m["alignment"].append(st.alignment_duration)
            m["sync"].append(st.sync_duration)
            m["async"].append(st.async_duration)
    return {v: {k: float(statistics.median(xs)) for k, xs in m.items() if xs} for v, m in per.items()}


def process_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a process, or None where /proc is not available."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class Runner:
    """Runs pipelines on one Spark session against one coordinator and collects their statistics."""

    def __init__(self, spark: Any, url: str, settings: Settings, status: Callable[[str], None] = lambda m: None,
                 coordinator_pid: int | None = None):
        self.spark = spark
        self.url = url
        self.s = settings
        self.status = status
        self.coordinator_pid = coordinator_pid
        self._n = 0

    def run(self, scenario: str, label: str, pipeline_factory: Callable[[str], Pipeline], last_vertex: str,
            policy: str | None, depth: int, seconds: float, network: NetworkConfig | None = None,
            interval_ms: int | None = None, alignment_timeout_ms: int | None = None,
            incremental: bool = False, checkpoint: dict[str, Any] | None = None) -> RunStats:
        """One run; ``checkpoint`` adds fields to the job's checkpoint config (e.g. an in-flight budget)."""
        from client.sync import OvertakeClient
        from contract.models import CheckpointConfig

        self._n += 1
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"bench-{scenario}-{label}-{int(time.time())}-{self._n}")
        pipeline = pipeline_factory(name)
        if policy is None:
            config = CheckpointConfig(interval=None)
        else:
            timeout = alignment_timeout_ms if alignment_timeout_ms is not None else self.s.alignment_timeout_ms
            fields: dict[str, Any] = dict(
                interval=interval_ms or self.s.interval_ms, policy=policy, retained=2,
                timeout=int(max(600_000, seconds * 4000)),
                alignment_timeout=timeout if policy in ("aligned_then_unaligned", "adaptive") else None,
                incremental_channel_state=incremental,
            )
            config = CheckpointConfig(**{**fields, **(checkpoint or {})})
        outcome: dict[str, Any] = {}

        def target() -> None:
            try:
                outcome["result"] = pipeline.run(self.spark, self.url, checkpoint=config, time_limit=seconds,
                                                 network=network or self.s.network())
            except BaseException as e:  # noqa: BLE001 - re-raised below
                outcome["error"] = e
            outcome["ended"] = int(time.time() * 1000)

        started = time.monotonic()
        cpu0 = process_cpu_seconds(self.coordinator_pid)
        t = threading.Thread(target=target, name=f"bench {name}", daemon=True)
        t.start()
        job_id = None
        with OvertakeClient(self.url) as client:
            while t.is_alive():
                t.join(1.0)
                try:
                    if job_id is None:
                        jobs = [j for j in client.list_jobs(limit=50).items if j.name == name]
                        job_id = jobs[0].id if jobs else None
                    if job_id is not None and policy is not None:
                        cps = client.list_checkpoints(job_id, limit=1000).items
                        done = sum(1 for c in cps if c.status.value == "COMPLETED")
                        self.status(f"{label}: {time.monotonic() - started:.0f} s, {len(cps)} checkpoints "
                                    f"triggered, {done} completed")
                    else:
                        self.status(f"{label}: {time.monotonic() - started:.0f} s")
                except Exception:  # noqa: BLE001 - the display only
                    pass
            if "error" in outcome:
                raise outcome["error"]
            result = outcome["result"]
            stats = RunStats(scenario, label, policy, depth, seconds, job_id=result.job_id,
                             wall_seconds=time.monotonic() - started)
            cpu1 = process_cpu_seconds(self.coordinator_pid)
            if cpu0 is not None and cpu1 is not None:
                stats.coordinator_cpu_s = cpu1 - cpu0
            stats.records = sum(r.records_in for r in result.subtasks if r.vertex == last_vertex)
            stats.throughput = stats.records / seconds
            if policy is not None:
                cps = client.list_checkpoints(result.job_id, limit=1000).items
                checkpoint_stats(stats, cps, outcome["ended"])
                stats.breakdown = ack_breakdown(client, result.job_id, cps, stats)
        return stats

    def backpressured(self, policy: str | None, depth: int, scenario: str = "backpressure",
                      network: NetworkConfig | None = None, seconds: float | None = None,
                      payload_bytes: int | None = None, checkpoint: dict[str, Any] | None = None,
                      label: str | None = None) -> RunStats:
        """The backpressured pipeline at ``depth``; ``network``, ``seconds`` and ``payload_bytes`` override the
        settings' for this run, ``checkpoint`` adds to its checkpoint config."""
        label = label or f"{policy or 'no checkpoints'}, depth {depth}"
        s = self.s if payload_bytes is None else replace(self.s, payload_bytes=payload_bytes)
        return self.run(scenario, label, lambda n: backpressured_pipeline(n, depth, s), f"slow-{depth}",
                        policy, depth, seconds or self.s.backpressure_seconds, network, checkpoint=checkpoint)

    def free(self, policy: str | None) -> RunStats:
        label = f"{policy or 'no checkpoints'}, no backpressure"
        return self.run("no-backpressure", label, lambda n: free_pipeline(n, self.s), "count", policy, 1,
                        self.s.no_backpressure_seconds)
