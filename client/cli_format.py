"""How the ``overtake`` command line shows things to people: durations, sizes and times, and one rich renderable
per wire model. (``--json`` bypasses all of this and prints the models' JSON.)

Server-supplied strings such as ``src[0]`` are never parsed as rich markup: everything here is a ``Text``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from client.models import (
    Checkpoint,
    CheckpointDetail,
    CheckpointStatistics,
    Event,
    Job,
    JobPage,
    RestorePlan,
)

DASH = "-"

STATUS_STYLES = {
    "COMPLETED": "green",
    "FINISHED": "green",
    "RUNNING": "cyan",
    "PENDING": "yellow",
    "CREATED": "yellow",
    "FAILING": "bold red",
    "ABORTED": "red",
    "FAILED": "red",
    "CANCELLED": "magenta",
}


# ------------------------------------------------------------------------------------------- units


def human_bytes(n: int | float | None) -> str:
    """``1536`` → ``1.5 KiB``; bytes below 1 KiB as they are."""
    if n is None:
        return DASH
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def duration(ms: int | float | None) -> str:
    """Milliseconds for people: ``850 ms``, ``2.35 s``, ``3m 05s``, ``1h 02m``."""
    if ms is None:
        return DASH
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def timestamp(ms: int | None) -> str:
    """Milliseconds since the epoch as local time, to the second."""
    if ms is None:
        return DASH
    return datetime.fromtimestamp(ms / 1000).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def status(value: Any) -> Text:
    name = getattr(value, "value", value)
    return Text(str(name), style=STATUS_STYLES.get(str(name), ""))


def _text(value: Any) -> Text:
    if isinstance(value, Text):
        return value
    return Text(DASH if value is None else str(value))


def _table(
    title: str | None, columns: Iterable[str], rows: Iterable[Iterable[Any]], right: set[str] = frozenset()
) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left", overflow="fold")
    for row in rows:
        table.add_row(*(_text(v) for v in row))
    return table


def _fields(pairs: Iterable[tuple[str, Any]]) -> Table:
    """A two-column grid of labels and values."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for label, value in pairs:
        grid.add_row(Text(label), _text(value))
    return grid


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)


# ------------------------------------------------------------------------------------------- jobs


def jobs_table(page: JobPage) -> Table:
    rows = [
        (
            job.id,
            job.name,
            status(job.status),
            job.current_attempt,
            job.num_completed,
            job.num_failed,
            job.num_in_progress,
            job.latest_completed_checkpoint_id,
            timestamp(job.updated_at),
        )
        for job in page.items
    ]
    columns = ["id", "name", "status", "attempt", "completed", "failed", "in progress", "latest", "updated"]
    title = f"{len(page.items)} of {page.total} jobs"
    return _table(
        title, columns, rows, right={"id", "attempt", "completed", "failed", "in progress", "latest"}
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
                f"{job.num_completed} completed, {job.num_failed} failed, {job.num_in_progress} in progress",
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


# ------------------------------------------------------------------------------------------- checkpoints


def _kind(cp: Checkpoint) -> str:
    return "savepoint" if cp.is_savepoint else cp.checkpoint_type.value


def checkpoints_table(items: list[Checkpoint], title: str | None = None) -> Table:
    rows = [
        (
            cp.id,
            _kind(cp),
            status(cp.status),
            cp.attempt,
            timestamp(cp.trigger_timestamp),
            duration(cp.end_to_end_duration),
            human_bytes(cp.state_size),
            human_bytes(cp.persisted_data),
            human_bytes(cp.processed_data),
            duration(cp.alignment_duration),
            f"{cp.num_acknowledged_subtasks}/{cp.num_subtasks}",
            cp.failure_reason,
        )
        for cp in items
    ]
    columns = [
        "id",
        "type",
        "status",
        "attempt",
        "triggered",
        "duration",
        "state",
        "persisted",
        "processed",
        "alignment",
        "acks",
        "failure",
    ]
    right = {"id", "attempt", "duration", "state", "persisted", "processed", "alignment", "acks"}
    return _table(title, columns, rows, right=right)


def checkpoint_view(cp: CheckpointDetail) -> Group:
    switched = DASH
    if cp.switched_to_unaligned_timestamp is not None:
        switched = f"{duration(cp.switched_to_unaligned_timestamp - cp.trigger_timestamp)} after the trigger"
    summary = _fields(
        [
            ("checkpoint", f"{cp.id} of job {cp.job_id}, attempt {cp.attempt}"),
            ("status", status(cp.status)),
            ("type", _kind(cp) + (" (stops the job)" if cp.stop_job else "")),
            ("policy", cp.policy.value),
            ("alignment timeout", duration(cp.alignment_timeout)),
            ("switched to unaligned", switched),
            ("triggered", timestamp(cp.trigger_timestamp)),
            ("completed", timestamp(cp.completed_timestamp)),
            ("end to end", duration(cp.end_to_end_duration)),
            ("state size", human_bytes(cp.state_size)),
            ("persisted in-flight data", human_bytes(cp.persisted_data)),
            ("processed data", human_bytes(cp.processed_data)),
            ("alignment", duration(cp.alignment_duration)),
            ("acknowledged", f"{cp.num_acknowledged_subtasks}/{cp.num_subtasks}"),
            ("failure", Text(cp.failure_reason, style="red") if cp.failure_reason else DASH),
            ("discarded", "yes" if cp.discarded else "no"),
        ]
    )
    rows = [
        (
            f"{s.vertex}[{s.subtask_index}]",
            timestamp(s.ack_timestamp),
            duration(s.end_to_end_duration),
            duration(s.sync_duration),
            duration(s.async_duration),
            duration(s.alignment_duration),
            duration(s.start_delay),
            human_bytes(s.state_size),
            human_bytes(s.processed_data),
            human_bytes(s.persisted_data),
            "yes" if s.unaligned else "no",
        )
        for s in sorted(cp.subtasks, key=lambda s: (s.vertex, s.subtask_index))
    ]
    columns = [
        "subtask",
        "acked",
        "end to end",
        "sync",
        "async",
        "alignment",
        "start delay",
        "state",
        "processed",
        "persisted",
        "unaligned",
    ]
    right = set(columns) - {"subtask", "acked", "unaligned"}
    parts: list[RenderableType] = [summary, _table("subtasks", columns, rows, right=right)]
    if cp.pending_subtasks:
        parts.append(Text("waiting for: " + ", ".join(cp.pending_subtasks), style="yellow"))
    return Group(*parts)


def checkpoint_line(cp: Checkpoint, verb: str) -> Text:
    text = Text(
        f"{verb} {_kind(cp)} {cp.id} of job {cp.job_id} (attempt {cp.attempt}, policy {cp.policy.value}): "
    )
    text.append_text(status(cp.status))
    return text


def stats_view(stats: CheckpointStatistics) -> Group:
    c = stats.counts
    counts = Text(
        f"{c.total} checkpoints: {c.completed} completed, {c.failed} failed, {c.in_progress} in progress, "
        f"{c.savepoints} savepoints"
    )
    s = stats.summary
    summary_rows = []
    for label, mma, fmt in (
        ("end to end", s.end_to_end_duration, duration),
        ("state size", s.state_size, human_bytes),
        ("persisted", s.persisted_data, human_bytes),
        ("processed", s.processed_data, human_bytes),
        ("alignment", s.alignment_duration, duration),
    ):
        summary_rows.append(
            (label, *(fmt(getattr(mma, k)) for k in ("min", "avg", "p50", "p90", "p99", "max")))
        )
    cols = ["", "min", "avg", "p50", "p90", "p99", "max"]
    parts: list[RenderableType] = [
        counts,
        _table("summary of completed checkpoints", cols, summary_rows, right=set(cols[1:])),
    ]
    if stats.history:
        parts.append(checkpoints_table(stats.history, title="history"))
    return Group(*parts)


# ------------------------------------------------------------------------------------------- recovery, events


def restore_plan_view(plan: RestorePlan) -> Group:
    if plan.checkpoint_id is None:
        head = Text(f"job {plan.job_id}: fresh start (no checkpoint to restore)")
    else:
        kind = "savepoint" if plan.is_savepoint else "checkpoint"
        head = Text(f"job {plan.job_id}: restore from {kind} {plan.checkpoint_id}")
    parts: list[RenderableType] = [head]
    for fallback in plan.fallbacks:
        parts.append(
            Text(f"passed over checkpoint {fallback.checkpoint_id}: {fallback.reason}", style="yellow")
        )

    def segments(items) -> str:
        if not items:
            return DASH
        return f"{len(items)} ({human_bytes(sum(s.length for s in items))}, {sum(s.record_count for s in items)} records)"

    rows = [
        (
            f"{s.vertex}[{s.subtask_index}]",
            DASH if s.key_group_start is None else f"{s.key_group_start}-{s.key_group_end}",
            f"{len(s.operator_state)} ({human_bytes(sum(r.size for r in s.operator_state))})"
            if s.operator_state
            else DASH,
            segments(s.output_channel_state),
            segments(s.input_channel_state),
            compact_json(s.source_offsets) if s.source_offsets else DASH,
        )
        for s in sorted(plan.subtasks, key=lambda s: (s.vertex, s.subtask_index))
    ]
    columns = [
        "subtask",
        "key groups",
        "operator state",
        "output channel state",
        "input channel state",
        "offsets",
    ]
    if rows:
        parts.append(_table(None, columns, rows))
    return Group(*parts)


def event_line(event: Event) -> Text:
    text = Text(f"#{event.id:<5} {timestamp(event.timestamp)}  ")
    style = {"checkpoint.completed": "green", "checkpoint.aborted": "red"}.get(event.type.value, "cyan")
    text.append(f"{event.type.value:<32}", style=style)
    text.append(" " + compact_json(event.data))
    return text
