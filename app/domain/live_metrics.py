"""Live metrics of running subtasks (records/s, backpressure, watermarks): the latest report of each, in memory.

A subtask reports what it measured over its last window about once a second. The coordinator keeps only the newest
report of each subtask, by the subtask's own timestamp (a retried or late report never replaces a newer one), and
only for the job's current attempt. Memory is bounded: one entry per subtask of the job's graph (reports of other
subtasks are refused), at most ``max_jobs`` jobs (the one reported to least recently is forgotten first), and a
report older than ``max_age`` is no longer shown. Nothing is written to the database: after a restart, or on
another replica, the figures come back with the subtasks' next reports.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from app.domain import lifecycle
from app.domain.checkpoints import check_subtask
from app.domain.context import Context, get_job_or_404, now_ms
from app.domain.jobs import token_refusal
from app.errors import Conflict, Unauthorized
from contract.models import (
    EventType,
    JobLiveMetrics,
    SubtaskLiveMetrics,
    SubtaskMetrics,
    SubtaskMetricsReport,
    VertexLiveMetrics,
)

MAX_AGE_MS = 10_000
"""Metrics older than this are left out of the live view: their subtask stopped reporting."""

FACTS_TTL = 1.0
"""Seconds a replica checks reports against what it last read of their job (its attempt, status and graph) without
reading it again: every subtask reports about once a second, so a job of 2,000 subtasks would otherwise cost 2,000
database reads a second. A report of an attempt newer than the one read makes it read again at once; a job that
ended or started an attempt is read again at once when its event reaches this replica (`LiveMetricsStore.heard`),
and within this bound anyway."""


@dataclass(frozen=True)
class _JobFacts:
    """What a metrics report is checked against, as read from the job's row (`check_current_attempt` and
    `check_subtask` read these attributes)."""

    id: int
    current_attempt: int | None
    status: str
    graph: dict
    read_at: float


@dataclass
class _Entry:
    timestamp: int
    received_at: int
    metrics: SubtaskMetrics


class LiveMetricsStore:
    """The newest metrics of each subtask of each job's current attempt."""

    def __init__(self, max_jobs: int = 10_000, max_age_ms: int = MAX_AGE_MS) -> None:
        self.max_jobs = max_jobs
        self.max_age_ms = max_age_ms
        self._jobs: OrderedDict[int, tuple[int, dict[tuple[str, int], _Entry]]] = OrderedDict()
        self._facts: OrderedDict[int, _JobFacts] = OrderedDict()
        self._lock = threading.Lock()

    def facts(self, job_id: int, attempt: int) -> _JobFacts | None:
        """What was read of the job within `FACTS_TTL`, unless the report names a newer attempt than it did."""
        with self._lock:
            f = self._facts.get(job_id)
        if f is None or time.monotonic() - f.read_at > FACTS_TTL:
            return None
        if f.current_attempt is None or attempt > f.current_attempt:
            return None
        return f

    def heard(self, event) -> None:
        """An event delivered to this replica (from any replica): a job that ended or started an attempt is read
        again for the next report, not after `FACTS_TTL`."""
        if getattr(event, "type", None) in (EventType.job_status, EventType.attempt_started):
            with self._lock:
                self._facts.pop(event.job_id, None)

    def remember(self, job) -> _JobFacts:
        f = _JobFacts(job.id, job.current_attempt, job.status, job.graph, time.monotonic())
        with self._lock:
            self._facts[job.id] = f
            self._facts.move_to_end(job.id)
            while len(self._facts) > self.max_jobs:
                self._facts.popitem(last=False)
        return f

    def record(
        self, job_id: int, attempt: int, vertex: str, index: int, report: SubtaskMetricsReport, now: int
    ) -> bool:
        """Keep the report unless a newer one of the subtask is kept; True when it was kept."""
        with self._lock:
            held = self._jobs.get(job_id)
            if held is None or held[0] < attempt:
                held = (attempt, {})
            elif held[0] > attempt:
                return False
            self._jobs[job_id] = held
            self._jobs.move_to_end(job_id)
            while len(self._jobs) > self.max_jobs:
                self._jobs.popitem(last=False)
            entries = held[1]
            old = entries.get((vertex, index))
            if old is not None and old.timestamp > report.timestamp:
                return False
            entries[(vertex, index)] = _Entry(report.timestamp, now, _with_lag(report))
            return True

    def latest(self, job_id: int, attempt: int | None, now: int) -> dict[tuple[str, int], _Entry]:
        """The recent entries of the attempt's subtasks."""
        with self._lock:
            held = self._jobs.get(job_id)
            if held is None or held[0] != attempt:
                return {}
            return {k: e for k, e in held[1].items() if now - e.received_at <= self.max_age_ms}

    def max_backpressure(self, job_id: int, attempt: int, now: int) -> float | None:
        """The highest backpressure among the attempt's recent reports (what the adaptive policy looks at)."""
        return _max(e.metrics.backpressure for e in self.latest(job_id, attempt, now).values())


async def report(
    ctx: Context,
    store: LiveMetricsStore,
    job_id: int,
    attempt: int,
    vertex: str,
    index: int,
    body: SubtaskMetricsReport,
    token_attempt: int | None = None,
) -> None:
    """Record a subtask's metrics: it must be a subtask of the job's current attempt, and the job must run. The job
    is read at most once per `FACTS_TTL` (`LiveMetricsStore.facts`). `token_attempt`: the attempt of the task token
    the report came with (None: admin, or no auth), which must be the report's."""
    if token_attempt is not None and token_attempt != attempt:
        raise Unauthorized(
            f"this task token belongs to attempt {token_attempt} of job {job_id}, not attempt {attempt}: "
            "report with the token of the attempt the subtask runs in"
        )
    job = store.facts(job_id, attempt)
    if job is None:
        async with ctx.tx(readonly=True) as s:
            job = store.remember(await get_job_or_404(s, job_id))
    if token_attempt is not None:
        refusal = token_refusal(job_id, token_attempt, job.current_attempt, job.status)
        if refusal is not None:
            raise Unauthorized(refusal)
    lifecycle.check_current_attempt(job, attempt, "this metrics report")
    if job.status not in lifecycle.ACTIVE:
        raise Conflict(f"job {job_id} is {job.status}; its subtasks no longer report metrics")
    check_subtask(job, vertex, index)
    store.record(job_id, attempt, vertex, index, body, now_ms())


async def live_view(s: AsyncSession, store: LiveMetricsStore, job_id: int) -> JobLiveMetrics:
    """Per vertex of the job, the sums, the backpressure and the low watermark of its subtasks' recent metrics."""
    job = await get_job_or_404(s, job_id)
    now = now_ms()
    running = job.status in lifecycle.ACTIVE
    entries = store.latest(job_id, job.current_attempt, now) if running else {}
    by_vertex: dict[str, list[tuple[int, _Entry]]] = {}
    for (vid, i), e in entries.items():  # once: a graph has up to 1,000 vertices and thousands of subtasks
        by_vertex.setdefault(vid, []).append((i, e))
    vertices = []
    for v in job.graph["vertices"]:
        mine = sorted(by_vertex.get(v["id"], []), key=lambda x: x[0])
        subtasks = [
            SubtaskLiveMetrics(
                vertex=v["id"], subtask_index=i, timestamp=e.timestamp, received_at=e.received_at, metrics=e.metrics
            )
            for i, e in mine
        ]
        vertices.append(
            VertexLiveMetrics(
                vertex=v["id"],
                parallelism=v["parallelism"],
                reporting=len(subtasks),
                records_in_per_second=_sum(st.metrics.records_in_per_second for st in subtasks),
                bytes_in_per_second=_sum(st.metrics.bytes_in_per_second for st in subtasks),
                backpressure_max=_max(st.metrics.backpressure for st in subtasks),
                backpressure_avg=_avg(st.metrics.backpressure for st in subtasks),
                **_low_watermark([st.metrics for st in subtasks]),
                subtasks=subtasks,
            )
        )
    return JobLiveMetrics(
        job_id=job_id, attempt=job.current_attempt, now=now, max_age=store.max_age_ms, vertices=vertices
    )


def _with_lag(report: SubtaskMetricsReport) -> SubtaskMetrics:
    """The report's metrics, with the watermark's lag measured at the report's timestamp if the subtask left it out."""
    m = report.metrics
    if m.watermark is None or m.watermark_lag_ms is not None:
        return m
    return m.model_copy(update={"watermark_lag_ms": report.timestamp - m.watermark})


def _low_watermark(metrics: list[SubtaskMetrics]) -> dict[str, int | None]:
    """The vertex's low watermark and its largest lag, by the rule of a subtask's input channels: the subtasks that
    have a watermark, idle ones left out unless every one of them is idle."""
    with_one = [m for m in metrics if m.watermark is not None]
    active = [m for m in with_one if not m.watermark_idle] or with_one
    if not active:
        return {"low_watermark": None, "watermark_lag_max_ms": None}
    lags = _known(m.watermark_lag_ms for m in active)
    return {
        "low_watermark": min(m.watermark for m in active),  # type: ignore[type-var]
        "watermark_lag_max_ms": max(lags) if lags else None,
    }


def _known(values) -> list[float]:
    return [v for v in values if v is not None]


def _sum(values) -> float | None:
    known = _known(values)
    return sum(known) if known else None


def _max(values) -> float | None:
    known = _known(values)
    return max(known) if known else None


def _avg(values) -> float | None:
    known = _known(values)
    return sum(known) / len(known) if known else None
