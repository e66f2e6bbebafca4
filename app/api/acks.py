"""The ack routes, the hottest of the service: one handler per route, served by a thin ASGI fast path.

Every subtask acks every checkpoint, so these two routes carry most of the traffic. Their handlers take the
raw body and the Authorization header and return (status, JSON bytes). `AckFastPath` serves them straight
from ASGI, before the framework's routing, dependency and exception layers (which cost more per request
than recording the ack); the FastAPI routes below call the same handlers and document them in openapi.yaml.
Behaviour, errors and auth are the same on both paths.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from app.api.deps import TASK, CheckpointId, CtxDep, JobId
from app.domain import blobs
from app.errors import DomainError, Invalid, TooLarge, validation_message
from client.models import (
    NAME_RE,
    AckBatch,
    AckBatchItem,
    AckBatchResult,
    AckResult,
    BlobRef,
    SubtaskAck,
    SubtaskReport,
)

router = APIRouter(prefix="/api/v1/jobs/{job_id}", tags=["tasks"])
ACK_PATH = re.compile(r"^/api/v1/jobs/([0-9]+)/checkpoints/([0-9]+)/acks(/batch)?$")
MAX_BODY = 16 * 1024 * 1024


def _error(exc: DomainError) -> tuple[int, bytes]:
    body: dict[str, Any] = {"code": exc.code, "message": exc.message}
    if exc.details is not None:
        body["details"] = exc.details
    return exc.status_code, json.dumps({"error": body}).encode()


def _invalid(exc: ValidationError) -> tuple[int, bytes]:
    errors = [{"loc": ["body", *e.get("loc", ())], "msg": e.get("msg")} for e in exc.errors()]
    body = {"code": "invalid", "message": validation_message(errors), "details": errors}
    return 422, json.dumps({"error": body}).encode()


async def handle_ack(state: Any, job_id: int, checkpoint_id: int, body: bytes, authorization: str | None):
    """One subtask's ack: answered only after it is committed (group commit). Returns (status, JSON bytes)."""
    try:
        await state.auth.require_job_header(authorization, job_id)
        ack = SubtaskAck.model_validate_json(body)
        (result,) = await state.committer.submit(job_id, checkpoint_id, [ack])
    except ValidationError as exc:
        return _invalid(exc)
    except DomainError as exc:
        return _error(exc)
    if isinstance(result, DomainError):
        return _error(result)
    return 200, result.model_dump_json().encode()


async def handle_ack_batch(state: Any, job_id: int, checkpoint_id: int, body: bytes, authorization: str | None):
    """Several subtasks' acks in one request; each item has its own status. Returns (status, JSON bytes)."""
    try:
        await state.auth.require_job_header(authorization, job_id)
        batch = AckBatch.model_validate_json(body)
        results = await state.committer.submit(job_id, checkpoint_id, batch.acks)
    except ValidationError as exc:
        return _invalid(exc)
    except DomainError as exc:
        return _error(exc)
    items = []
    for a, r in zip(batch.acks, results, strict=True):
        if isinstance(r, DomainError):
            items.append(
                AckBatchItem(
                    vertex=a.vertex, subtask_index=a.subtask_index, ok=False, status_code=r.status_code, error=r.message
                )
            )
        else:
            items.append(
                AckBatchItem(vertex=a.vertex, subtask_index=a.subtask_index, ok=True, status_code=200, result=r)
            )
    return 200, AckBatchResult(items=items).model_dump_json().encode()


class AckFastPath:
    """ASGI middleware: POSTs to the two ack routes go straight to their handlers; everything else passes on."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        match = ACK_PATH.match(scope["path"])
        if match is None:
            return await self.app(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY:
                return await _respond(send, *_error(TooLarge(f"an ack request is limited to {MAX_BODY} bytes; split it")))
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        authorization = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
                break
        handler = handle_ack_batch if match.group(3) else handle_ack
        state = scope["app"].state
        status, payload = await handler(state, int(match.group(1)), int(match.group(2)), b"".join(chunks), authorization)
        await _respond(send, status, payload)


async def _respond(send, status: int, payload: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def _json_body(model: type) -> dict:
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


@router.post("/checkpoints/{checkpoint_id}/acks", response_model=AckResult, openapi_extra=_json_body(SubtaskAck))
async def ack(job_id: JobId, checkpoint_id: CheckpointId, request: Request) -> Response:
    """A subtask's part of the checkpoint is durable. Answered after the ack is committed; idempotent: the same
    ack again succeeds and changes nothing, a different one is 409. Needs the job's task token (or admin)."""
    status, payload = await handle_ack(
        request.app.state, job_id, checkpoint_id, await request.body(), request.headers.get("authorization")
    )
    return Response(payload, status_code=status, media_type="application/json")


@router.post(
    "/checkpoints/{checkpoint_id}/acks/batch", response_model=AckBatchResult, openapi_extra=_json_body(AckBatch)
)
async def ack_batch(job_id: JobId, checkpoint_id: CheckpointId, request: Request) -> Response:
    """Several subtasks' acks in one request (a Spark task hosting a chain); each item has its own status."""
    status, payload = await handle_ack_batch(
        request.app.state, job_id, checkpoint_id, await request.body(), request.headers.get("authorization")
    )
    return Response(payload, status_code=status, media_type="application/json")


REPORT_PARTS = ("ack", "operator_state", "channel_state")
_REPORT_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["ack"],
                    "properties": {
                        "ack": {
                            "type": "string",
                            "description": "The SubtaskReport as JSON: the ack, with the sha256 and size of each blob part.",
                        },
                        "operator_state": {"type": "string", "format": "binary", "description": "Operator-state blob."},
                        "channel_state": {"type": "string", "format": "binary", "description": "Channel-state blob."},
                    },
                },
                "encoding": {"ack": {"contentType": "application/json"}},
            }
        },
    }
}


async def _chunks(part: UploadFile):
    await part.seek(0)
    while chunk := await part.read(1024 * 1024):
        yield chunk


@router.post(
    "/checkpoints/{checkpoint_id}/acks/with-state",
    response_model=AckResult,
    dependencies=TASK,
    openapi_extra=_REPORT_BODY,
)
async def ack_with_state(job_id: JobId, checkpoint_id: CheckpointId, request: Request, ctx: CtxDep) -> AckResult:
    """A subtask's state blobs and its ack in one request (what a subtask does after each barrier, otherwise two
    uploads and an ack). The blobs are verified against the sha256 in the report and stored first, then the ack is
    committed; a retry stores nothing twice and answers as the ack route does (the same ack: 200, `duplicate`)."""
    ctype = request.headers.get("content-type", "")
    if not ctype.startswith("multipart/form-data"):
        raise Invalid(
            f"send multipart/form-data with the fields {', '.join(REPORT_PARTS)} (got content type {ctype!r})"
        )
    length = request.headers.get("content-length")
    limit = 2 * ctx.settings.max_blob_size + MAX_BODY
    if length and length.isdigit() and int(length) > limit:
        raise TooLarge(f"the request of {length} bytes exceeds the coordinator's limit of {limit} bytes")
    try:
        form = await request.form(max_files=2, max_fields=1, max_part_size=MAX_BODY)
    except HTTPException as exc:
        raise Invalid(f"the multipart body cannot be read: {exc.detail}") from None
    try:
        report, stored = await _store_report(ctx, form, job_id, checkpoint_id)
    finally:
        await form.close()
    refs = {info.kind: BlobRef(blob_id=info.blob_id, sha256=info.sha256, size=info.size) for info, _ in stored}
    ack = report.to_ack(refs.get("operator"), refs.get("channel"))
    (result,) = await request.app.state.committer.submit(job_id, checkpoint_id, [ack])
    if isinstance(result, DomainError):
        raise result
    return result


async def _store_report(ctx, form, job_id: int, checkpoint_id: int):
    """Validate the report and its parts against each other, then store the blobs; returns (report, stored)."""
    unknown = sorted(set(form.keys()) - set(REPORT_PARTS))
    if unknown:
        raise Invalid(f"unknown part(s) {unknown}; the parts are {', '.join(REPORT_PARTS)}")
    raw = form.get("ack")
    if not isinstance(raw, str):
        raise Invalid("the 'ack' field (the SubtaskReport as JSON) is missing or sent as a file")
    try:
        report = SubtaskReport.model_validate_json(raw)
    except ValidationError as exc:
        errors = [{"loc": ["ack", *e.get("loc", ())], "msg": e.get("msg")} for e in exc.errors()]
        raise Invalid(validation_message(errors), details=errors) from None
    if not NAME_RE.match(report.vertex):
        raise Invalid(f"vertex {report.vertex!r} is not a valid vertex id")
    parts = []
    for kind in ("operator", "channel"):
        declared, part = getattr(report, f"{kind}_state"), form.get(f"{kind}_state")
        if declared is None and part is None:
            continue
        if declared is None:
            raise Invalid(f"a {kind}_state part was sent but the report does not declare it ({kind}_state)")
        if not isinstance(part, UploadFile):
            raise Invalid(f"the report declares {kind}_state but no {kind}_state file part was sent")
        if part.size is not None and part.size != declared.size:
            raise Invalid(
                f"the {kind}_state part has {part.size} bytes but the report declares {declared.size}; "
                "nothing was stored"
            )
        parts.append((kind, declared.sha256, _chunks(part)))
    stored = await blobs.store(ctx, job_id, checkpoint_id, report.attempt, report.vertex, report.subtask_index, parts)
    return report, stored
