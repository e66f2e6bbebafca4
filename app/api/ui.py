"""Routes for the web UI: where a job's event stream stands, and a safe preview of a channel-state segment.

A segment is framed buffers and a buffer is framed pickled records (``contract.channel_state``). Channel state comes
from subtasks, so the coordinator treats it as untrusted: records are unpickled by :class:`SafeUnpickler`, which
resolves only a tiny allow-list of harmless classes; anything else is shown as hex and marked unsupported. Bytes
read, records decoded, the size of a record decoded and the length of each rendering are all bounded.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import io
import pickle
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from app.api.deps import TASK, CheckpointId, CtxDep, JobId
from app.domain import blobs, views
from app.domain.context import get_job_or_404
from app.errors import NotFound
from contract.channel_state import FRAME, spans
from contract.models import MAX_PARALLELISM, NAME_PATTERN

router = APIRouter(prefix="/api/v1/jobs/{job_id}", tags=["ui"])

MAX_RECORD_BYTES = 64 * 1024
TEXT_LIMIT = 2000
HEX_LIMIT = 64


class EventCursor(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: int
    latest_event_id: int = Field(
        description="Id of the job's newest event (0: none); follow with ?after= it."
    )


class RecordPreview(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int = Field(description="Position of the record in the segment (0-based).")
    buffer: int = Field(description="Position of its buffer in the segment (0-based).")
    size: int = Field(description="Size of the record's pickle bytes.")
    status: Literal["ok", "unsupported", "too_large", "error"]
    type: str | None = Field(default=None, description="Python type name of the decoded value.")
    text: str = Field(description="A bounded rendering of the value, or why it was not decoded.")
    hex: str | None = Field(
        default=None, description="The first bytes, in hex, when the record was not decoded."
    )


class SegmentPreview(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: int
    checkpoint_id: int
    vertex: str
    subtask_index: int
    channel: str
    direction: Literal["input", "output"]
    segment_length: int = Field(description="Bytes of the whole segment.")
    bytes_read: int = Field(description="Bytes of the segment read for this preview.")
    buffer_count: int
    record_count: int = Field(description="Records in the whole segment, as its subtask reported.")
    records: list[RecordPreview]
    truncated: bool = Field(description="More records follow than the preview shows.")


# --------------------------------------------------------------------------- safe decoding


def _bytearray(*args: Any) -> bytearray:
    if not args or not isinstance(args[0], (bytes, str)):  # bytearray(10**12) would allocate, refuse sizes
        raise pickle.UnpicklingError("bytearray is only rebuilt from bytes")
    return bytearray(*args[:2]) if isinstance(args[0], str) else bytearray(args[0])


_ALLOWED: dict[tuple[str, str], Any] = {
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "bytearray"): _bytearray,
    ("builtins", "complex"): complex,
    ("datetime", "datetime"): datetime.datetime,
    ("datetime", "date"): datetime.date,
    ("datetime", "time"): datetime.time,
    ("datetime", "timedelta"): datetime.timedelta,
    ("datetime", "timezone"): datetime.timezone,
    ("decimal", "Decimal"): decimal.Decimal,
}


class Unsupported(Exception):
    """The record needs a class outside the allow-list."""


class SafeUnpickler(pickle.Unpickler):
    """Resolves only the allow-list; never imports or calls anything else."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = _ALLOWED.get((module, name))
        if allowed is None:
            raise Unsupported(f"{module}.{name}")
        return allowed

    def persistent_load(self, pid: Any) -> Any:
        raise Unsupported("persistent id")


def safe_loads(data: bytes) -> Any:
    return SafeUnpickler(io.BytesIO(data)).load()


def render(value: Any, limit: int = TEXT_LIMIT) -> str:
    """A repr-like rendering cut at ``limit`` characters, safe on shared and cyclic structures."""
    out: list[str] = []
    used = [0]
    cut = [False]

    def put(s: str) -> bool:
        room = limit - used[0]
        if len(s) > room:
            out.append(s[:room])
            used[0] = limit
            cut[0] = True
            return False
        out.append(s)
        used[0] += len(s)
        return True

    def walk(v: Any, path: set[int], depth: int) -> bool:
        if depth > 50:
            return put("…")
        if isinstance(v, (list, tuple, set, frozenset, dict)):
            if id(v) in path:
                return put("<cycle>")
            path = path | {id(v)}
            if isinstance(v, dict):
                opening, closing = "{", "}"
            elif isinstance(v, list):
                opening, closing = "[", "]"
            elif isinstance(v, tuple):
                opening, closing = "(", ",)" if len(v) == 1 else ")"
            elif not v:
                return put(f"{type(v).__name__}()")
            else:
                opening, closing = ("{", "}") if type(v) is set else ("frozenset({", "})")
            if not put(opening):
                return False
            for i, item in enumerate(v.items() if isinstance(v, dict) else v):
                if i and not put(", "):
                    return False
                if isinstance(v, dict):
                    if not (walk(item[0], path, depth + 1) and put(": ") and walk(item[1], path, depth + 1)):
                        return False
                elif not walk(item, path, depth + 1):
                    return False
            return put(closing)
        if isinstance(v, (str, bytes, bytearray)):
            return put(repr(v[: limit - used[0] + 1]))
        try:
            text = repr(v)
        except ValueError:  # e.g. an int past the digit limit
            text = f"<{type(v).__name__}>"
        return put(text)

    walk(value, set(), 0)
    text = "".join(out)
    return text[: max(0, limit - 1)] + "…" if cut[0] else text


def preview_record(data: bytes, index: int, buffer: int) -> RecordPreview:
    base = {"index": index, "buffer": buffer, "size": len(data)}
    if len(data) > MAX_RECORD_BYTES:
        return RecordPreview(
            **base,
            status="too_large",
            text=f"record of {len(data)} bytes; the preview decodes records up to {MAX_RECORD_BYTES} bytes",
            hex=data[:HEX_LIMIT].hex(),
        )
    try:
        value = safe_loads(data)
    except Unsupported as exc:
        return RecordPreview(
            **base,
            status="unsupported",
            text=f"needs {exc}, which the preview does not load",
            hex=data[:HEX_LIMIT].hex(),
        )
    except Exception as exc:  # a corrupt or hostile pickle: show it, never fail the page
        return RecordPreview(
            **base,
            status="error",
            text=f"not a readable pickle ({type(exc).__name__})",
            hex=data[:HEX_LIMIT].hex(),
        )
    try:
        text = render(value)
    except RecursionError:
        text = "<too deeply nested>"
    return RecordPreview(**base, status="ok", type=type(value).__name__, text=text)


def decode_segment(data: bytes, complete: bool, max_records: int) -> tuple[list[RecordPreview], bool]:
    """Records of the leading bytes of a segment; the last buffer may be cut when ``complete`` is false.

    Returns the previews and whether records were left out (by the record limit or the byte limit)."""
    records: list[RecordPreview] = []
    buffers, whole_end = spans(data)
    cut = whole_end != len(data)
    partial = None
    if len(data) - whole_end >= FRAME.size:  # the last buffer was cut off: its whole records are still shown
        partial = len(buffers)
        buffers.append((whole_end + FRAME.size, len(data)))
    for buffer, (start, end) in enumerate(buffers):
        found, stop = spans(data, start, end)
        for rstart, rend in found:
            if len(records) >= max_records:
                return records, True
            records.append(preview_record(data[rstart:rend], len(records), buffer))
        if stop != end and buffer != partial:
            records.append(
                RecordPreview(
                    index=len(records),
                    buffer=buffer,
                    size=end - stop,
                    status="error",
                    text="the buffer's framing is broken here; the rest of the buffer is not shown",
                    hex=data[stop : stop + HEX_LIMIT].hex(),
                )
            )
    return records, not complete or cut


# --------------------------------------------------------------------------- routes


@router.get("/events/cursor", dependencies=TASK, response_model=EventCursor)
async def event_cursor(job_id: JobId, ctx: CtxDep) -> EventCursor:
    """Where the job's event log stands, so a viewer follows only new events (`/events?after=`)."""
    async with ctx.tx(readonly=True) as s:
        job = await get_job_or_404(s, job_id)
        return EventCursor(job_id=job_id, latest_event_id=job.event_seq or 0)


@router.get(
    "/checkpoints/{checkpoint_id}/channel-state/preview", dependencies=TASK, response_model=SegmentPreview
)
async def preview_channel_segment(
    job_id: JobId,
    checkpoint_id: CheckpointId,
    ctx: CtxDep,
    vertex: Annotated[str, Query(pattern=NAME_PATTERN)],
    subtask_index: Annotated[int, Query(ge=0, lt=MAX_PARALLELISM)],
    channel: Annotated[str, Query(min_length=1, max_length=512)],
    direction: Literal["input", "output"],
    max_records: Annotated[int, Query(ge=1, le=500)] = 50,
    max_bytes: Annotated[int, Query(ge=1024, le=4 * 1024 * 1024)] = 256 * 1024,
) -> SegmentPreview:
    """Decoded records of one channel-state segment, for the UI: bounded, and never unpickling arbitrary classes."""
    async with ctx.tx(readonly=True) as s:
        entry = await views.channel_state_entry(s, job_id, checkpoint_id, vertex, subtask_index)
    if entry is None:
        raise NotFound(
            f"checkpoint {checkpoint_id} of job {job_id} has no channel state of {vertex}[{subtask_index}]"
        )
    segment = next((g for g in entry.segments if g.channel == channel and g.direction == direction), None)
    if segment is None:
        names = ", ".join(f"{g.direction} {g.channel}" for g in entry.segments) or "none"
        raise NotFound(f"{vertex}[{subtask_index}] has no {direction} segment {channel!r} (it has: {names})")
    length = min(segment.length, max_bytes)
    # the segment's runs: one in the entry's own blob, or (incremental channel state) its parts, some of them in
    # blobs earlier checkpoints wrote
    runs = [(p.blob_id or entry.blob_id, p.offset, p.length) for p in segment.parts or []]
    runs = runs or [(entry.blob_id, segment.offset, segment.length)]
    pieces: list[bytes] = []
    left = length
    for blob_id, offset, size in runs:
        if left <= 0:
            break
        row = await blobs.open_blob(ctx, job_id, blob_id)
        key, base = blobs.object_of(row)
        n = min(size, left)
        chunks = ctx.store.read_range(key, base + offset, base + offset + n - 1)
        pieces.append(b"".join([c async for c in chunks]))
        left -= n
    data = b"".join(pieces)
    records, truncated = await asyncio.to_thread(decode_segment, data, length == segment.length, max_records)
    return SegmentPreview(
        job_id=job_id,
        checkpoint_id=checkpoint_id,
        vertex=vertex,
        subtask_index=subtask_index,
        channel=segment.channel,
        direction=segment.direction,
        segment_length=segment.length,
        bytes_read=len(data),
        buffer_count=segment.buffer_count,
        record_count=segment.record_count,
        records=records,
        truncated=truncated,
    )
