"""Routes for the web UI: where a job's event stream stands, and a safe preview of a channel-state segment (the
bytes read are bounded here; the records are decoded by ``app.api.preview``, which never unpickles arbitrary
classes)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from app.api.deps import TASK, CheckpointId, CtxDep, JobId
from app.api.preview import SegmentPreview, decode_segment
from app.domain import blobs, channel_state_views
from app.domain.context import get_job_or_404
from app.errors import NotFound
from contract.models import MAX_PARALLELISM, NAME_PATTERN

router = APIRouter(prefix="/api/v1/jobs/{job_id}", tags=["ui"])

class EventCursor(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: int
    latest_event_id: int = Field(
        description="Id of the job's newest event (0: none); follow with ?after= it."
    )


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
        entry = await channel_state_views.channel_state_entry(s, job_id, checkpoint_id, vertex, subtask_index)
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
    records, truncated = await asyncio.to_thread(
        decode_segment, data, length == segment.length, max_records, segment.codec
    )
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
