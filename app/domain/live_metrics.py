"""Live metrics of running subtasks (records/s, backpressure, watermarks): the latest report of each, in memory.

A subtask reports what it measured over its last window about once a second. The coordinator keeps only the newest
report of each subtask, by the subtask's own timestamp (a retried or late report never replaces a newer one), and
only for the job's current attempt. Memory is bounded: one entry per subtask of the job's graph (reports of other
subtasks are refused), at most ``max_jobs`` jobs (the one reported to least recently is forgotten first), and a
report older than ``max_age`` is no longer shown. Nothing is written to the database: after a restart, or on
another replica, the figures come back with the subtasks' next reports.

A restored subtask's reports carry its recovery (what it restored, its replay); the current attempt's recovery
phases (`LiveMetricsStore.phases`) come from those, all of them however old, and from when the previous attempt's
last report arrived, remembered when the first report of the next attempt replaces them.
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
from app.errors import Conflict, DomainError, Unauthorized
from contract.models import (
    EventType,
    JobLiveMetrics,
    RecoveryPhases,
    SubtaskLiveMetrics,
    SubtaskMetrics,
    SubtaskMetricsBatch,
    SubtaskMetricsBatchOutcome,
    SubtaskMetricsBatchResult,
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
        self._ended: OrderedDict[int, tuple[int, int]] = OrderedDict()
        """Per job, its previous attempt and when that attempt's last report arrived (what detect is measured from)."""
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
                if held is not None and held[1]:
                    self._ended[job_id] = (held[0], max(e.received_at for e in held[1].values()))
                    self._ended.move_to_end(job_id)
                    while len(self._ended) > self.max_jobs:
                        self._ended.popitem(last=False)
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

    def last_report(self, job_id: int, attempt: int) -> int | None:
        """When the last report of the attempt arrived (None: none is known)."""
        with self._lock:
            held = self._jobs.get(job_id)
            if held is not None and held[0] == attempt and held[1]:
                return max(e.received_at for e in held[1].values())
            ended = self._ended.get(job_id)
            return ended[1] if ended is not None and ended[0] == attempt else None

    def phases(self, job_id: int, attempt: int, started_at: int, subtasks: int) -> RecoveryPhases | None:
        """The attempt's recovery phases from what its restored subtasks (``subtasks`` in all) last reported, and the
        previous attempt's last report; None when nothing of either is known here."""
        with self._lock:
            held = self._jobs.get(job_id)
            entries = list(held[1].values()) if held is not None and held[0] == attempt else []
        previous = self.last_report(job_id, attempt - 1) if attempt > 1 else None
        recoveries = [e.metrics.recovery for e in entries if e.metrics.recovery is not None]
        if previous is None and not recoveries:
            return None
        loops = _known(r.loop_started_at for r in recoveries)
        first_loop = min(loops) if loops else None
        finished = _known(r.replay_finished_at for r in recoveries)
        all_finished = len(finished) == subtasks and len(recoveries) == subtasks
        last_finish = max(finished) if all_finished else None
        restores = _known(r.restore_ms for r in recoveries)
        return RecoveryPhases(
            detect_ms=started_at - previous if previous is not None and previous <= started_at else None,
            relaunch_ms=first_loop - started_at if first_loop is not None and first_loop >= started_at else None,
            restore_ms=max(restores) if restores else None,
            replay_ms=last_finish - first_loop if last_finish is not None and first_loop is not None else None,
            replaying=sum(1 for r in recoveries if r.replay_finished_at is None) if recoveries else None,
            replay_finished_at=last_finish,
        )

    def max_backpressure(self, job_id: int, attempt: int, now: int) -> float | None:
        """The highest backpressure among the attempt's recent reports (what the adaptive policy looks at)."""
        return _max(e.metrics.backpressure for e in self.latest(job_id, attempt, now).values())


async def _reporting_job(
    ctx: Context, store: LiveMetricsStore, job_id: int, attempt: int, token_attempt: int | None
) -> _JobFacts:
    """The job the reports of ``attempt`` are checked against: the token must be the attempt's, the attempt the
    job's current one, and the job running."""
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
    return job


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
    job = await _reporting_job(ctx, store, job_id, attempt, token_attempt)
    check_subtask(job, vertex, index)
    store.record(job_id, attempt, vertex, index, body, now_ms())


async def report_batch(
    ctx: Context,
    store: LiveMetricsStore,
    job_id: int,
    attempt: int,
    body: SubtaskMetricsBatch,
    token_attempt: int | None = None,
) -> SubtaskMetricsBatchResult:
    """Record several subtasks' metrics of one attempt (a host relay's batch), each as `report` would, under its
    own subtask and timestamp. What concerns the whole attempt (the token, the attempt being current, the job
    running) fails the whole request; a report naming no subtask of the job fails alone."""
    job = await _reporting_job(ctx, store, job_id, attempt, token_attempt)
    now = now_ms()
    items: list[SubtaskMetricsBatchOutcome] = []
    for r in body.reports:
        try:
            check_subtask(job, r.vertex, r.subtask_index)
        except DomainError as e:
            items.append(SubtaskMetricsBatchOutcome(vertex=r.vertex, subtask_index=r.subtask_index,
                                                    status_code=e.status_code, error=str(e)))
            continue
        store.record(job_id, attempt, r.vertex, r.subtask_index,
                     SubtaskMetricsReport(timestamp=r.timestamp, metrics=r.metrics), now)
        items.append(SubtaskMetricsBatchOutcome(vertex=r.vertex, subtask_index=r.subtask_index, status_code=204))
    return SubtaskMetricsBatchResult(items=items)


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
                **_replay([st.metrics for st in subtasks]),
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


def _replay(metrics: list[SubtaskMetrics]) -> dict[str, int | None]:
    """How many of the subtasks still replay, and the sums of what the restored ones restored and replayed."""
    recoveries = [m.recovery for m in metrics if m.recovery is not None]
    if not recoveries:
        return {"replaying": 0, "restored_bytes": None, "replayed_bytes": None}
    return {
        "replaying": sum(1 for r in recoveries if r.replay_finished_at is None),
        "restored_bytes": sum(r.restored_bytes or 0 for r in recoveries),
        "replayed_bytes": sum(r.replayed_bytes or 0 for r in recoveries),
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
