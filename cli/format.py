"""How the ``overtake`` command line shows things to people: durations, sizes and times, and one rich renderable
per wire model. (``--json`` bypasses all of this and prints the models' JSON.)

Server-supplied strings such as ``src[0]`` are never parsed as rich markup: everything here is a ``Text``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from contract import units
from contract.models import (
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
    return units.human_bytes(n, DASH)


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


@dataclass(frozen=True)
class Col:
    """A column of a :class:`FitTable`: ``keep`` ranks how long it stays when the width runs out (higher stays
    longer); a ``free`` column holds free text that may be cut short with an ellipsis."""

    name: str
    keep: int = 5
    right: bool = False
    free: bool = False


FREE_MIN = 16
"""The narrowest a free-text column gets before columns are left out."""


class FitTable:
    """A table that fits the width it is drawn in (the terminal's, or ``COLUMNS``): cells never wrap; free-text
    columns are cut short with an ellipsis first, then the least important columns are left out, and the title says
    which (``--json`` has everything)."""

    def __init__(self, title: str | None, columns: list[Col], rows: Iterable[Iterable[Any]]) -> None:
        self.title = title
        self.columns = columns
        self.rows = [[_text(v) for v in row] for row in rows]

    def _widths(self, index: int) -> tuple[int, int]:
        """(natural, narrowest) width of a column, padding included."""
        col = self.columns[index]
        natural = max([len(col.name), *(row[index].cell_len for row in self.rows)])
        narrowest = min(natural, max(len(col.name), FREE_MIN)) if col.free else natural
        return natural + 3, narrowest + 3

    def layout(self, width: int) -> tuple[list[int], list[str]]:
        """The indices of the columns that fit in ``width``, and the names of those left out."""
        shown = list(range(len(self.columns)))
        left_out: list[str] = []
        while len(shown) > 1 and sum(self._widths(i)[1] for i in shown) + 1 > width:
            victim = min(shown, key=lambda i: (self.columns[i].keep, -i))
            shown.remove(victim)
            left_out.append(self.columns[victim].name)
        return shown, left_out

    def table(self, width: int) -> Table:
        shown, left_out = self.layout(width)
        title = self.title
        if left_out:
            note = f"(left out for the width: {', '.join(left_out)}; widen the terminal or use --json)"
            title = f"{title} {note}" if title else note
        table = Table(title=title, title_justify="left", header_style="bold")
        fixed = sum(self._widths(i)[0] for i in shown if not self.columns[i].free)
        free = [i for i in shown if self.columns[i].free]
        room = (width - 1 - fixed) // max(1, len(free)) - 3  # what is left for each free-text column
        for i in shown:
            col = self.columns[i]
            natural = self._widths(i)[0] - 3
            table.add_column(
                col.name,
                justify="right" if col.right else "left",
                no_wrap=True,
                overflow="ellipsis",
                min_width=min(natural, FREE_MIN) if col.free else natural,
                max_width=max(min(natural, FREE_MIN), room) if col.free else None,
            )
        for row in self.rows:
            table.add_row(*(row[i] for i in shown))
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table(options.max_width)


def _table(
    title: str | None,
    columns: Iterable[str],
    rows: Iterable[Iterable[Any]],
    right: set[str] = frozenset(),
    keep: dict[str, int] | None = None,
    free: set[str] = frozenset(),
) -> FitTable:
    keep = keep or {}
    cols = [Col(c, keep.get(c, 5), c in right, c in free) for c in columns]
    return FitTable(title, cols, rows)


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


def jobs_table(page: JobPage) -> FitTable:
    rows = [
        (
            job.id,
            job.name,
            status(job.status),
            job.current_attempt,
            job.num_completed,
            job.num_failed - job.num_interrupted,
            job.num_in_progress,
            job.latest_completed_checkpoint_id,
            timestamp(job.updated_at),
        )
        for job in page.items
    ]
    columns = ["id", "name", "status", "attempt", "completed", "failed", "in progress", "latest", "updated"]
    title = f"{len(page.items)} of {page.total} jobs"
    return _table(
        title,
        columns,
        rows,
        right={"id", "attempt", "completed", "failed", "in progress", "latest"},
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
                f"{job.num_completed} completed, {job.num_failed - job.num_interrupted} failed, "
                f"{job.num_interrupted} not finished (the job ended or restarted), {job.num_in_progress} in progress",
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


INTERRUPTED = {"subsumed", "new_attempt", "job_cancelled", "job_ended"}


def checkpoint_status(cp: Checkpoint) -> Text:
    """The status; an aborted checkpoint that did not fail (its job ended, a restart) is not shown as a failure."""
    if cp.abort_reason in INTERRUPTED:
        return Text("NOT FINISHED", style="yellow")
    return status(cp.status)


def checkpoints_table(items: list[Checkpoint], title: str | None = None) -> FitTable:
    rows = [
        (
            cp.id,
            _kind(cp),
            checkpoint_status(cp),
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
    keep = {"id": 9, "status": 9, "type": 8, "duration": 8, "persisted": 7, "acks": 6, "failure": 6,
            "alignment": 5, "state": 4, "processed": 4, "triggered": 3, "attempt": 2}
    return _table(title, columns, rows, right=right, keep=keep, free={"failure"})


def checkpoint_view(cp: CheckpointDetail) -> Group:
    switched = DASH
    if cp.switched_to_unaligned_timestamp is not None:
        switched = f"{duration(cp.switched_to_unaligned_timestamp - cp.trigger_timestamp)} after the trigger"
    summary = _fields(
        [
            ("checkpoint", f"{cp.id} of job {cp.job_id}, attempt {cp.attempt}"),
            ("status", checkpoint_status(cp)),
            ("type", _kind(cp) + (" (stops the job)" if cp.stop_job else "")),
            ("policy", cp.policy.value if cp.decision is None else f"{cp.policy.value}, chosen by adaptive: "
             f"{cp.decision.reason}"),
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
        "async*",
        "alignment",
        "start delay",
        "state",
        "processed",
        "persisted",
        "unaligned",
    ]
    right = set(columns) - {"subtask", "acked", "unaligned"}
    keep = {"subtask": 9, "end to end": 8, "persisted": 7, "alignment": 6, "sync": 5, "start delay": 5,
            "state": 5, "async*": 4, "processed": 4, "unaligned": 3, "acked": 2}
    parts: list[RenderableType] = [summary]
    if cp.subtasks and cp.vertices:
        parts.append(vertex_table(cp))
    parts.append(_table("subtasks", columns, rows, right=right, keep=keep))
    parts.append(
        Text(
            "* async: what a subtask did after its snapshot before sending its ack; the upload of its state travels "
            "with the ack and is not in it (nor is an aligned barrier's wait in full outputs)",
            style="dim",
        )
    )
    if cp.pending_subtasks:
        parts.append(Text("waiting for: " + ", ".join(cp.pending_subtasks), style="yellow"))
    return Group(*parts)


def vertex_table(cp: CheckpointDetail) -> FitTable:
    """Per vertex, each figure's average and maximum across its subtasks (min/avg/max in --json)."""

    def avg_max(mma, fmt) -> str:
        return DASH if mma.max is None else f"{fmt(mma.avg)} / {fmt(mma.max)}"

    rows = [
        (
            v.vertex,
            f"{v.num_acknowledged_subtasks}/{v.parallelism}",
            avg_max(v.end_to_end_duration, duration),
            avg_max(v.alignment_duration, duration),
            avg_max(v.start_delay, duration),
            avg_max(v.sync_duration, duration),
            avg_max(v.processed_data, human_bytes),
            avg_max(v.persisted_data, human_bytes),
            avg_max(v.state_size, human_bytes),
        )
        for v in cp.vertices
    ]
    columns = ["vertex", "acked", "end to end", "alignment", "start delay", "sync", "processed", "persisted", "state"]
    keep = {"vertex": 9, "acked": 8, "end to end": 8, "persisted": 7, "alignment": 6, "processed": 5,
            "start delay": 4, "state": 3, "sync": 2}
    return _table("by vertex (avg / max across subtasks)", columns, rows, right=set(columns[1:]), keep=keep)


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
        keep = {"subtask": 9, "operator state": 7, "input channel state": 6, "output channel state": 6,
                "key groups": 4, "offsets": 3}
        parts.append(_table(None, columns, rows, keep=keep, free={"offsets"}))
    return Group(*parts)


def event_line(event: Event) -> Text:
    text = Text(f"#{event.id:<5} {timestamp(event.timestamp)}  ")
    style = {"checkpoint.completed": "green", "checkpoint.aborted": "red"}.get(event.type.value, "cyan")
    text.append(f"{event.type.value:<32}", style=style)
    text.append(" " + compact_json(event.data))
    return text
