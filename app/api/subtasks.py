"""Routes a job's subtasks use besides acks (those are in `app/api/acks.py`): blob uploads and downloads, reports
of corrupt blobs, declines, the event stream and its history."""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel
from sse_starlette.sse import EventSourceResponse

from app.api.deps import TASK, BlobId, CheckpointId, CtxDep, JobId, Offset, TokenAttempt
from app.domain import blobs, views
from app.domain.checkpoints import decline as decline_checkpoint
from app.domain.context import get_job_or_404, now_ms
from app.errors import Invalid, TooLarge
from app.events import follow, read_log, to_sse
from contract.models import (
    MAX_ATTEMPT,
    MAX_ID,
    MAX_PARALLELISM,
    NAME_PATTERN,
    NAME_RE,
    BlobInfo,
    Checkpoint,
    CorruptBlob,
    Decline,
    Event,
)

router = APIRouter(prefix="/api/v1/jobs/{job_id}", tags=["subtasks"])
M = TypeVar("M", bound=BaseModel)


@router.post(
    "/checkpoints/{checkpoint_id}/blobs",
    status_code=201,
    dependencies=TASK,
    response_model=BlobInfo,
    responses={200: {"model": BlobInfo, "description": "The same blob was stored before; nothing changed."}},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def upload_blob(
    job_id: JobId,
    checkpoint_id: CheckpointId,
    request: Request,
    ctx: CtxDep,
    attempt: Annotated[int, Query(ge=1, le=MAX_ATTEMPT)],
    vertex: Annotated[str, Query(pattern=NAME_PATTERN)],
    subtask_index: Annotated[int, Query(ge=0, lt=MAX_PARALLELISM)],
    kind: Literal["operator", "channel"],
    x_overtake_sha256: Annotated[
        str, Header(pattern=r"^[0-9a-fA-F]{64}$", description="Hex sha256 of the body; verified before storing.")
    ],
    response: Response,
) -> BlobInfo:
    """Upload a subtask's operator or channel state as a streamed body. Stored only if its sha256 matches."""
    if not NAME_RE.match(vertex):
        raise Invalid(f"vertex {vertex!r} is not a valid vertex id")
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > ctx.settings.max_blob_size:
        raise TooLarge(
            f"the upload of {length} bytes exceeds the coordinator's limit of {ctx.settings.max_blob_size} bytes "
            "(OVERTAKE_MAX_BLOB_SIZE)"
        )
    info, created = await blobs.upload(
        ctx, job_id, checkpoint_id, attempt, vertex, subtask_index, kind, x_overtake_sha256, request.stream()
    )
    response.status_code = 201 if created else 200
    return info


@router.get(
    "/blobs/{blob_id}",
    dependencies=TASK,
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/octet-stream": {}}},
        206: {"description": "The requested byte range.", "content": {"application/octet-stream": {}}},
    },
)
async def download_blob(
    job_id: JobId,
    blob_id: BlobId,
    ctx: CtxDep,
    range_: Annotated[str | None, Header(alias="range")] = None,
) -> StreamingResponse:
    """Download a blob, whole or a `Range: bytes=a-b` of it (206)."""
    row = await blobs.open_blob(ctx, job_id, blob_id)
    rng = blobs.parse_range(range_, row.size)
    start, end = rng if rng else (0, row.size - 1)
    headers = {
        "Accept-Ranges": "bytes",
        "Content-Length": str(max(0, end - start + 1)),
        "X-Overtake-Sha256": row.sha256,
        "ETag": f'"{row.sha256}"',
    }
    if rng:
        headers["Content-Range"] = f"bytes {start}-{end}/{row.size}"
    key, offset = blobs.object_of(row)
    body = ctx.store.read_range(key, offset + start, offset + end) if row.size else _empty()
    return StreamingResponse(
        body, status_code=206 if rng else 200, headers=headers, media_type="application/octet-stream"
    )


async def _empty():
    if False:
        yield b""


@router.post("/blobs/{blob_id}/corrupt", dependencies=TASK, response_model=BlobInfo)
async def report_corrupt_blob(job_id: JobId, blob_id: BlobId, body: CorruptBlob, ctx: CtxDep) -> BlobInfo:
    """A restoring subtask of the current attempt read the blob and its bytes do not match its sha256: the blob is
    marked corrupt, and the next restore plan falls back past its checkpoint, naming the blob and the reporter.
    Idempotent (a blob stays marked as it was first reported)."""
    return await blobs.mark_corrupt(ctx, job_id, blob_id, body)


@router.post("/checkpoints/{checkpoint_id}/declines", dependencies=TASK, response_model=Checkpoint)
async def decline(job_id: JobId, checkpoint_id: CheckpointId, body: Decline, ctx: CtxDep) -> Checkpoint:
    """A subtask cannot take this checkpoint: it is aborted with the subtask's reason."""
    async with ctx.tx() as s:
        cp = await decline_checkpoint(s, job_id, checkpoint_id, body, now_ms())
        return views.checkpoint_model(cp)


@router.get("/events/history", dependencies=TASK, response_model=list[Event])
async def event_history(
    job_id: JobId,
    ctx: CtxDep,
    after: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> list[Event]:
    """The job's events after `after`, oldest first (the polling form of the stream)."""
    async with ctx.tx(readonly=True) as s:
        await get_job_or_404(s, job_id)
        return await read_log(s, job_id, after, limit, ctx.bus.namespace)


@router.get(
    "/events",
    dependencies=TASK,
    response_class=EventSourceResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "Server-sent events; resume with Last-Event-ID.",
        }
    },
)
async def events(
    job_id: JobId,
    request: Request,
    ctx: CtxDep,
    attempt: TokenAttempt,
    after: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None,
    last_event_id: Annotated[str | None, Header(alias="last-event-id")] = None,
) -> EventSourceResponse:
    """The job's event stream (SSE). A reconnecting client sends Last-Event-ID and misses nothing."""
    # A task token's stream ends with the `attempt.started` of a later attempt: the token stops working then, and
    # the new attempt's events (its checkpoints' write targets among them) are not for it.
    async with ctx.tx(readonly=True) as s:
        await get_job_or_404(s, job_id)
    start = after or 0
    if last_event_id:
        value = last_event_id.strip()
        if not (value.isascii() and value.isdigit()) or int(value) > MAX_ID:
            raise Invalid(f"Last-Event-ID {last_event_id!r} is not an event id (a number from 0 to {MAX_ID})")
        start = int(value)

    async def read(since: int) -> list[Event]:
        async with ctx.tx(readonly=True) as s:
            return await read_log(s, job_id, since, deployment=ctx.bus.namespace)

    async def stream():
        async for e in follow(ctx.bus, read, job_id, start, attempt=attempt):
            if await request.is_disconnected():
                break
            yield to_sse(e)

    return EventSourceResponse(stream(), ping=10)
