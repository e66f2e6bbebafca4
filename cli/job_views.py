"""How the command line shows a job: the job list, one job, its live subtasks (with a restored subtask's replay) and
its attempts (with the current one's recovery phases). Re-exported by ``cli.format``."""

from __future__ import annotations

from rich.console import Group, RenderableType

from cli.tables import (
    DASH,
    FitTable,
    _fields,
    _table,
    checkpoint_counts,
    duration,
    human_bytes,
    status,
    timestamp,
)
from contract.models import AttemptPage, Job, JobLiveMetrics, JobPage, RecoveryPhases, SubtaskRecovery

# ------------------------------------------------------------------------------------------- jobs


def jobs_table(page: JobPage) -> FitTable:
    rows = [
        (
            job.id,
            job.name,
            status(job.status),
            job.current_attempt,
            job.num_completed,
            job.num_failed,
            job.num_not_finished,
            job.num_in_progress,
            job.latest_completed_checkpoint_id,
            timestamp(job.updated_at),
        )
        for job in page.items
    ]
    columns = [
        "id", "name", "status", "attempt", "completed", "failed", "not finished", "in progress", "latest", "updated"
    ]
    title = f"{len(page.items)} of {page.total} jobs"
    return _table(
        title,
        columns,
        rows,
        right={"id", "attempt", "completed", "failed", "not finished", "in progress", "latest"},
        keep={"id": 9, "name": 9, "status": 9, "latest": 7, "completed": 6, "failed": 6, "updated": 1},
        free={"name"},
    )


def job_view(job: Job) -> Group:
    cfg = job.checkpoint
    state = status(job.status)
    if job.status_message:
        state.append(f" ({job.status_message})", style="")
    latest = DASH
    if job.latest_completed_checkpoint_id is not None:
        latest = f"{job.latest_completed_checkpoint_id} at {timestamp(job.latest_completed_at)}"
    summary = _fields(
        [
            ("job", f"{job.id} {job.name} ({job.kind})"),
            ("status", state),
            ("attempt", job.current_attempt),
            ("created", timestamp(job.created_at)),
            ("updated", timestamp(job.updated_at)),
            (
                "checkpoints",
                checkpoint_counts(job.num_completed, job.num_failed, job.num_not_finished, job.num_in_progress),
            ),
            ("latest completed", latest),
            ("consecutive failures", f"{job.consecutive_failures} (tolerated: {cfg.tolerable_failures})"),
            ("interval", duration(cfg.interval) if cfg.interval is not None else "off"),
            ("policy", cfg.policy.value),
            ("alignment timeout", duration(cfg.alignment_timeout)),
            ("timeout", duration(cfg.timeout)),
            ("min pause", duration(cfg.min_pause)),
            ("max concurrent", cfg.max_concurrent),
            ("retained", cfg.retained),
            ("labels", ", ".join(f"{k}={v}" for k, v in sorted(job.labels.items())) or DASH),
        ]
    )
    vertices = _table(
        "vertices",
        ["id", "name", "kind", "parallelism", "max parallelism", "keyed"],
        [
            (v.id, v.name or v.id, v.kind, v.parallelism, v.max_parallelism, "yes" if v.keyed else "no")
            for v in job.graph.vertices
        ],
        right={"parallelism", "max parallelism"},
    )
    parts: list[RenderableType] = [summary, vertices]
    if job.graph.edges:
        edges = _table(
            "edges",
            ["source", "target", "partitioning"],
            [(e.source, e.target, e.partitioning.value) for e in job.graph.edges],
        )
        parts.append(edges)
    return Group(*parts)


def replay_cell(recovery: SubtaskRecovery | None) -> str:
    """A subtask's replay: ``replay 1.2 MiB / 2.5 MiB`` while it replays, ``done 3.10 s`` (from its loop's start)
    once it finished, ``-`` after a fresh start."""
    if recovery is None:
        return DASH
    if recovery.replay_finished_at is not None:
        if recovery.loop_started_at is None:
            return "done"
        return f"done {duration(max(0, recovery.replay_finished_at - recovery.loop_started_at))}"
    return f"replay {human_bytes(recovery.replayed_bytes)} / {human_bytes(recovery.restored_bytes)}"


def live_table(live: JobLiveMetrics) -> FitTable:
    """A row per reporting subtask of the current attempt: its rates, backpressure, watermark lag and replay."""
    rows = [
        (
            v.vertex,
            st.subtask_index,
            _rate(st.metrics.records_in_per_second),
            _share(st.metrics.backpressure),
            duration(st.metrics.watermark_lag_ms),
            replay_cell(st.metrics.recovery),
        )
        for v in live.vertices
        for st in v.subtasks
    ]
    replaying = sum(v.replaying for v in live.vertices)
    title = f"job {live.job_id}, attempt {live.attempt if live.attempt is not None else DASH}: " + (
        f"{len(rows)} subtasks reporting" + (f", {replaying} replaying" if replaying else "")
    )
    return _table(
        title,
        ["vertex", "subtask", "records/s", "backpressure", "watermark lag", "replay"],
        rows,
        right={"subtask", "records/s", "backpressure", "watermark lag"},
        keep={"vertex": 9, "subtask": 9, "replay": 8, "records/s": 7, "backpressure": 6},
        free={"vertex"},
    )


def _rate(value: float | None) -> str:
    return DASH if value is None else f"{value:,.0f}"


def _share(value: float | None) -> str:
    return DASH if value is None else f"{value:.0%}"


def replay_phase(phases: RecoveryPhases | None) -> str:
    """The replay phase: its duration once every subtask finished, else how many still replay."""
    if phases is None:
        return DASH
    if phases.replay_ms is not None:
        return duration(phases.replay_ms)
    if phases.replaying:
        return f"{phases.replaying} replaying"
    return DASH


def attempts_table(page: AttemptPage) -> FitTable:
    """A row per attempt, newest first, with the current attempt's recovery phases."""
    rows = [
        (
            a.attempt,
            timestamp(a.started_at),
            timestamp(a.ended_at),
            a.restored_checkpoint_id,
            duration(a.phases.detect_ms if a.phases else None),
            duration(a.phases.relaunch_ms if a.phases else None),
            duration(a.phases.restore_ms if a.phases else None),
            replay_phase(a.phases),
            a.reason,
        )
        for a in page.items
    ]
    return _table(
        f"{len(page.items)} of {page.total} attempts",
        ["attempt", "started", "ended", "restored", "detect", "relaunch", "restore", "replay", "reason"],
        rows,
        right={"attempt", "restored", "detect", "relaunch", "restore", "replay"},
        keep={"attempt": 9, "started": 8, "restored": 7, "replay": 7, "restore": 6, "relaunch": 6, "detect": 6},
        free={"reason"},
    )
