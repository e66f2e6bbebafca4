"""How the ``overtake`` command line shows things to people: durations, sizes and times, and one rich renderable
per wire model. (``--json`` bypasses all of this and prints the models' JSON.)

Server-supplied strings such as ``src[0]`` are never parsed as rich markup: everything here is a ``Text``.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from cli.job_views import (  # noqa: E402,F401  (re-exported: the commands use them as fmt.<name>)
    attempts_table,
    job_view,
    jobs_table,
    live_table,
    replay_cell,
    replay_phase,
)
from cli.tables import (  # noqa: F401  (re-exported: the commands and tests use them as fmt.<name>)
    DASH,
    FREE_MIN,
    STATUS_STYLES,
    Col,
    FitTable,
    _fields,
    _table,
    _text,
    checkpoint_counts,
    compact_json,
    duration,
    human_bytes,
    status,
    timestamp,
)
from contract.models import (
    Checkpoint,
    CheckpointDetail,
    CheckpointStatistics,
    Event,
    RestorePlan,
)

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
        f"{c.total} checkpoints: {checkpoint_counts(c.completed, c.failed, c.not_finished, c.in_progress)}; "
        f"{c.savepoints} of them savepoints"
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
