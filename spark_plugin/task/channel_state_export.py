"""Channel state readable outside Overtake: the Arrow batches a checkpoint holds in flight on batch edges, written
as one Arrow IPC file per segment (the Arrow file format) that ``pyarrow.ipc.open_file`` opens, and DuckDB
through pyarrow or its Arrow extension.

The persisted buffers stay what travelled on the wire (pickled records, ``contract.channel_state``); this turns a
segment's records back into Arrow: a record that is a ``pyarrow.RecordBatch``, or a record holding one in a
``batch`` field (a keyed sub-batch), is written as it is; any other record (a record edge's value) is counted and
left out, and watermark markers are skipped. The records are unpickled, so export only checkpoints of jobs you
trust. Each file's schema metadata names where its rows were in flight: ``overtake.vertex``,
``overtake.subtask`` (the subtask that persisted them), ``overtake.direction``, ``overtake.channel``,
``overtake.peer_vertex``, ``overtake.peer_subtask`` and ``overtake.checkpoint_id``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.models import RestorePlan, RestoreSegment
from spark_plugin.network.elements import is_marker
from spark_plugin.network.framing import decode_records
from spark_plugin.network.recovered import FetchBlob, segment_buffers


@dataclass
class ExportedSegment:
    """One segment's export: the file written (None when the segment held no Arrow batch) and what it counted."""

    vertex: str
    subtask: int
    direction: str
    channel: str
    path: Path | None
    batches: int
    rows: int
    other_records: int
    """Records that are not Arrow batches (record edges), left out of the file."""


def arrow_batch(record: Any) -> Any | None:
    """The ``pyarrow.RecordBatch`` a record is or holds in its ``batch`` field; None for any other record."""
    import pyarrow as pa

    if isinstance(record, pa.RecordBatch):
        return record
    batch = getattr(record, "batch", None)
    return batch if isinstance(batch, pa.RecordBatch) else None


def plan_segments(plan: RestorePlan) -> list[tuple[str, RestoreSegment]]:
    """Each segment of a restore plan once, with the vertex it was persisted by (a rescaled plan sends one segment
    to several subtasks)."""
    seen: set[tuple] = set()
    out: list[tuple[str, RestoreSegment]] = []
    for part in plan.subtasks:
        for seg in [*part.output_channel_state, *part.input_channel_state]:
            key = (part.vertex, seg.from_subtask, seg.direction, seg.channel)
            if key not in seen:
                seen.add(key)
                out.append((part.vertex, seg))
    return out


def _file_name(vertex: str, seg: RestoreSegment) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", seg.channel).strip("_")
    return f"{vertex}-{seg.from_subtask}-{seg.direction}-{safe}.arrow"


def export_segment(
    vertex: str, seg: RestoreSegment, fetch: FetchBlob, out_dir: Path, checkpoint_id: int | None = None
) -> ExportedSegment:
    """Write one segment's Arrow batches as an Arrow IPC file in ``out_dir`` (batches of differing schemas are
    unified, missing columns filled with nulls)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    batches, other = [], 0
    for buf in segment_buffers(fetch, seg):
        for record in decode_records(buf):
            if is_marker(record):
                continue
            batch = arrow_batch(record)
            if batch is None:
                other += 1
            else:
                batches.append(batch)
    done = ExportedSegment(vertex, seg.from_subtask, seg.direction, seg.channel, None, len(batches),
                           sum(b.num_rows for b in batches), other)
    if not batches:
        return done
    table = pa.concat_tables([pa.Table.from_batches([b]) for b in batches], promote_options="permissive")
    meta = {
        "overtake.vertex": vertex,
        "overtake.subtask": str(seg.from_subtask),
        "overtake.direction": seg.direction,
        "overtake.channel": seg.channel,
        "overtake.peer_vertex": seg.peer_vertex or "",
        "overtake.peer_subtask": "" if seg.peer_subtask is None else str(seg.peer_subtask),
        "overtake.checkpoint_id": "" if checkpoint_id is None else str(checkpoint_id),
    }
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta})
    out_dir.mkdir(parents=True, exist_ok=True)
    done.path = out_dir / _file_name(vertex, seg)
    with ipc.new_file(str(done.path), table.schema) as writer:
        for batch in table.to_batches():
            writer.write_batch(batch)
    return done


def export_arrow(
    segments: Iterable[tuple[str, RestoreSegment]], fetch: FetchBlob, out_dir: Path, checkpoint_id: int | None = None
) -> list[ExportedSegment]:
    """Export every segment (``(vertex, segment)``, e.g. :func:`plan_segments`) into ``out_dir``."""
    return [export_segment(vertex, seg, fetch, out_dir, checkpoint_id) for vertex, seg in segments]
