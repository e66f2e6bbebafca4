"""What the Structured Streaming listener tells the coordinator, read off Spark's events: plain snapshots of
progress events, the job (name, labels, graph) of a query, and each micro-batch as an ``ExternalCheckpoint``.

Nothing here talks to Spark's JVM or to the coordinator: the functions take PySpark's event objects (or the dicts
of their JSON) and return plain data, so they are tested without Spark.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timezone
from typing import Any

from contract.models import NAME_RE, Partitioning

KIND = "structured_streaming"
QUERY_LABEL = "spark_query_id"  # Spark's query id: stable across restarts from the same checkpoint location
MAX_MESSAGE = 4000
RETAINED = 100

_STATE_FIELDS = (
    "operatorName",
    "numRowsTotal",
    "numRowsUpdated",
    "numRowsRemoved",
    "numRowsDroppedByWatermark",
    "memoryUsedBytes",
    "allUpdatesTimeMs",
    "allRemovalsTimeMs",
    "commitTimeMs",
    "numShufflePartitions",
    "numStateStoreInstances",
)
_RATE_FIELDS = ("numInputRows", "inputRowsPerSecond", "processedRowsPerSecond")


def snapshot(progress: Any) -> dict[str, Any]:
    """A plain, JSON-ready copy of a ``StreamingQueryProgress`` (no JVM references), taken on Spark's thread.

    Offsets stay the JSON strings Spark gives; ``None`` for an absent one.
    """

    def get(obj: Any, name: str, default: Any = None) -> Any:
        if isinstance(obj, dict) and name in obj:
            return obj[name]
        return getattr(obj, name, default)

    def offset(value: Any) -> str | None:
        if value is None or value == "None" or value == "null":
            return None
        return value if isinstance(value, str) else json.dumps(value)

    sink = get(progress, "sink")
    return _finite(
        {
            "id": str(get(progress, "id")),
            "runId": str(get(progress, "runId")),
            "name": get(progress, "name"),
            "timestamp": get(progress, "timestamp"),
            "batchId": int(get(progress, "batchId")),
            "batchDuration": get(progress, "batchDuration"),
            "durationMs": dict(get(progress, "durationMs") or {}),
            "eventTime": dict(get(progress, "eventTime") or {}),
            **{f: get(progress, f) for f in _RATE_FIELDS},
            "stateOperators": [
                {f: get(op, f) for f in _STATE_FIELDS} for op in get(progress, "stateOperators") or []
            ],
            "sources": [
                {
                    "description": get(src, "description"),
                    "startOffset": offset(get(src, "startOffset")),
                    "endOffset": offset(get(src, "endOffset")),
                    **{f: get(src, f) for f in _RATE_FIELDS},
                }
                for src in get(progress, "sources") or []
            ],
            "sink": {"description": get(sink, "description"), "numOutputRows": get(sink, "numOutputRows")},
        }
    )


def _finite(value: Any) -> Any:
    """NaN and infinities (Spark's rates of a first batch) are not JSON: they become None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


# --------------------------------------------------------------------------- the job of a query


def job_name(name: str | None, query_id: str) -> str:
    """The query's name made a valid job name, or its id when it has none."""
    if name:
        cleaned = re.sub(r"[^A-Za-z0-9_.\-]+", "_", name).strip("_")[:128]
        if NAME_RE.match(cleaned):
            return cleaned
    return str(query_id)


def _vertex_id(text: str, index: int) -> str:
    base = re.sub(r"[^A-Za-z0-9_.\-]+", "_", text or "operator").strip("_")[:100] or "operator"
    return f"{base}-{index}"


def graph_of(progress: dict[str, Any] | None) -> dict[str, Any]:
    """The job graph of a query, from a progress snapshot: ``source-<i>`` per source, one keyed vertex per
    stateful operator (its parallelism is the number of shuffle partitions, which the checkpoint fixes, so
    ``max_parallelism`` is the same), and ``sink``. Sources feed the first stateful operator through a hash edge
    (Spark's shuffle); the sink runs in the tasks of the last stage.

    Without a progress (a query that failed before its first batch completed) the graph is one ``query`` vertex.
    """
    if not progress:
        return {"vertices": [{"id": "query", "parallelism": 1, "kind": "operator"}], "edges": []}
    vertices: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    sources: list[str] = []
    for i, src in enumerate(progress.get("sources") or []):
        vid = f"source-{i}"
        sources.append(vid)
        vertices.append(
            {"id": vid, "name": _short(src.get("description")), "parallelism": 1, "kind": "source"}
        )
    upstream, parallelism = sources, 1
    for j, op in enumerate(progress.get("stateOperators") or []):
        n = max(1, int(op.get("numShufflePartitions") or 1))
        vid = _vertex_id(op.get("operatorName") or "state", j)
        vertices.append(
            {"id": vid, "name": _short(op.get("operatorName")), "parallelism": n, "max_parallelism": n,
             "keyed": True}
        )
        edges += [{"source": u, "target": vid, "partitioning": Partitioning.hash.value} for u in upstream]
        upstream, parallelism = [vid], n
    sink = progress.get("sink") or {}
    vertices.append(
        {
            "id": "sink",
            "name": _short(sink.get("description")),
            "parallelism": parallelism,
            "max_parallelism": max(parallelism, 128),
            "kind": "sink",
        }
    )
    edges += [{"source": u, "target": "sink", "partitioning": Partitioning.forward.value} for u in upstream]
    return {"vertices": vertices, "edges": edges}


def _short(text: str | None) -> str | None:
    return text[:200] if text else None


def job_spec(
    query_id: str, name: str | None, progress: dict[str, Any] | None, labels: dict[str, str]
) -> dict:
    """The ``JobCreate`` body of a query: no periodic triggers (Spark checkpoints on its own), aligned."""
    return {
        "name": job_name(name, query_id),
        "kind": KIND,
        "graph": graph_of(progress),
        # retained: Spark keeps the metadata of its last 100 batches (spark.sql.streaming.minBatchesToRetain)
        "checkpoint": {"interval": None, "policy": "aligned", "retained": RETAINED},
        "labels": {**labels, QUERY_LABEL: str(query_id)},
    }


# --------------------------------------------------------------------------- a micro-batch as a checkpoint


def epoch_ms(timestamp: str) -> int:
    """Spark's ISO-8601 timestamps (``2026-01-01T10:00:00.123Z``) in ms since the epoch."""
    when = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(round(when.timestamp() * 1000))


def restore_offset(end_offset: str | None) -> dict[str, Any] | None:
    """A source's end offset as the coordinator keeps restore offsets (a JSON object per source vertex):
    Kafka's and the file source's offsets are objects already; a bare value (the rate source's) is wrapped."""
    if end_offset is None:
        return None
    try:
        value = json.loads(end_offset)
    except ValueError:
        value = end_offset
    return value if isinstance(value, dict) else {"offset": value}


def checkpoint_of(progress: dict[str, Any]) -> dict[str, Any]:
    """The ``ExternalCheckpoint`` body of one micro-batch (a progress snapshot), keyed by its batch id.

    Duration: ``durationMs.triggerExecution`` after the trigger timestamp. State size: the memory of the state
    stores. Processed data: input rows. Restore offsets: each source's end offset. Everything else Spark reports
    (the ``durationMs`` breakdown with ``walCommit`` and ``commitOffsets``, rates, state rows) is kept in
    ``metrics``.
    """
    durations = progress.get("durationMs") or {}
    started = epoch_ms(progress["timestamp"])
    took = durations.get("triggerExecution", progress.get("batchDuration") or 0)
    states = progress.get("stateOperators") or []
    offsets = {
        f"source-{i}": restore_offset(src.get("endOffset"))
        for i, src in enumerate(progress.get("sources") or [])
    }
    offsets = {k: v for k, v in offsets.items() if v is not None}
    return {
        "id": int(progress["batchId"]),
        "trigger_timestamp": started,
        "completed_timestamp": started + max(0, int(took or 0)),
        "state_size": sum(int(op.get("memoryUsedBytes") or 0) for op in states),
        "processed_data": int(progress.get("numInputRows") or 0),
        "persisted_data": 0,
        "source_offsets": offsets or None,
        "metrics": {
            "runId": progress.get("runId"),
            "batchDuration": progress.get("batchDuration"),
            "durationMs": durations,
            "walCommit": durations.get("walCommit"),
            "commitOffsets": durations.get("commitOffsets"),
            **{f: progress.get(f) for f in _RATE_FIELDS},
            "stateRowsTotal": sum(int(op.get("numRowsTotal") or 0) for op in states),
            "stateRowsUpdated": sum(int(op.get("numRowsUpdated") or 0) for op in states),
            "stateMemoryUsedBytes": sum(int(op.get("memoryUsedBytes") or 0) for op in states),
            "stateOperators": states,
            "sources": [
                {k: v for k, v in src.items() if k != "endOffset"} for src in progress.get("sources") or []
            ],
            "sink": progress.get("sink"),
            "eventTime": progress.get("eventTime") or {},
        },
    }


def failure_message(exception: str | None) -> str | None:
    """The message of a query's exception without the JVM stack frames (Spark sends the whole trace)."""
    if not exception:
        return None
    head = re.split(r"\n\s*at [\w$.<>]+\(", exception, maxsplit=1)[0].strip()
    return head if len(head) <= MAX_MESSAGE else head[: MAX_MESSAGE - 1] + "…"
