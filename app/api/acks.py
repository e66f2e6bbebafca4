"""The ack routes, the hottest of the service: one handler per route, served by a thin ASGI fast path.

Every subtask acks every checkpoint, so these two routes carry most of the traffic. Their handlers take the
raw body and the Authorization header and return (status, JSON bytes). `AckFastPath` serves them straight
from ASGI, before the framework's routing, dependency and exception layers (which cost more per request
than recording the ack); the FastAPI routes below call the same handlers and document them in openapi.yaml.
Behaviour, errors and auth are the same on both paths.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from app.api.deps import TASK, CheckpointId, CtxDep, JobId
from app.api.guards import receive_within, respond, too_large
from app.api.multipart import MultipartStream
from app.db.session import TransientDatabaseError
from app.domain import blobs, written
from app.errors import DomainError, Invalid, RequestTimeout, error_json, invalid_from
from contract.models import (
    MAX_ID,
    AckBatch,
    AckBatchItem,
    AckBatchResult,
    AckResult,
    BlobRef,
    SubtaskAck,
    SubtaskReport,
)

router = APIRouter(prefix="/api/v1/jobs/{job_id}", tags=["subtasks"])
BROWSER_HEADERS = (b"origin", b"sec-fetch-site")
ACK_PATH = re.compile(r"^/api/v1/jobs/([0-9]{1,20})/checkpoints/([0-9]{1,20})/acks(/batch)?$")


def _error(exc: DomainError) -> tuple[int, bytes, dict[str, str]]:
    """The error's answer, with its headers (a 503's Retry-After)."""
    return exc.status_code, error_json(exc), exc.headers


def _invalid(exc: ValidationError) -> tuple[int, bytes, dict[str, str]]:
    return _error(invalid_from(exc.errors(), ("body",)))


async def handle_ack(state: Any, job_id: int, checkpoint_id: int, body: bytes, authorization: str | None):
    """One subtask's ack: answered only after it is committed (group commit). Returns (status, JSON bytes,
    headers)."""
    try:
        token_attempt = await state.auth.require_job_header(authorization, job_id)
        ack = SubtaskAck.model_validate_json(body)
        missing = None
        if ack.written is not None:  # state the subtask wrote into the blob store itself: is it there?
            (check,) = await written.check(state.ctx, job_id, checkpoint_id, [ack])
            if check.refusal is not None:
                return _error(check.refusal)
            missing = [check.missing]
        (result,) = await state.committer.submit(job_id, checkpoint_id, [ack], token_attempt, missing)
    except ValidationError as exc:
        return _invalid(exc)
    except DomainError as exc:
        return _error(exc)
    if isinstance(result, DomainError):
        return _error(result)
    return 200, result.model_dump_json().encode(), {}


async def handle_ack_batch(state: Any, job_id: int, checkpoint_id: int, body: bytes, authorization: str | None):
    """Several subtasks' acks in one request; each item has its own status. Returns (status, JSON bytes, headers)."""
    try:
        token_attempt = await state.auth.require_job_header(authorization, job_id)
        batch = AckBatch.model_validate_json(body)
        if any(a.written is not None for a in batch.acks):
            results = await _submit_written(state, job_id, checkpoint_id, batch.acks, token_attempt)
        else:
            results = await state.committer.submit(job_id, checkpoint_id, batch.acks, token_attempt)
    except ValidationError as exc:
        return _invalid(exc)
    except DomainError as exc:
        return _error(exc)
    items = []
    for a, r in zip(batch.acks, results, strict=True):
        # built from values the coordinator made itself: constructed without validating them again
        if isinstance(r, DomainError):
            items.append(
                AckBatchItem.model_construct(
                    vertex=a.vertex, subtask_index=a.subtask_index, ok=False, status_code=r.status_code,
                    error=r.message, result=None,
                )
            )
        else:
            items.append(
                AckBatchItem.model_construct(
                    vertex=a.vertex, subtask_index=a.subtask_index, ok=True, status_code=200, result=r, error=None
                )
            )
    return 200, AckBatchResult.model_construct(items=items).model_dump_json().encode(), {}


async def _submit_written(state: Any, job_id: int, checkpoint_id: int, acks: list[SubtaskAck], token_attempt):
    """Acks of which some name objects they wrote: those objects are checked (concurrently) before the acks are
    submitted; an ack refused by the check is answered without being submitted."""
    checks = await written.check(state.ctx, job_id, checkpoint_id, acks)
    submitted = [i for i, c in enumerate(checks) if c is None or c.refusal is None]
    missing = [checks[i].missing if checks[i] is not None else None for i in submitted]
    answers = await state.committer.submit(
        job_id, checkpoint_id, [acks[i] for i in submitted], token_attempt, missing
    ) if submitted else []
    results: list = [c.refusal if c is not None else None for c in checks]
    for i, answer in zip(submitted, answers, strict=True):
        results[i] = answer
    return results


class AckFastPath:
    """ASGI middleware, the outermost of the app's own: POSTs to the two ack routes from clients that are not
    browsers go straight to their handlers; everything else (browsers' requests included, which the cross-origin
    guard must see) passes on through the guards to the routes. It applies the same body limit and body timeout
    (408 for a body that stalls), and answers a transient database failure of the token lookup with 503 (the
    committer retries its own transactions)."""

    def __init__(self, app: Any, *, max_body: int, body_timeout: float = 60.0) -> None:
        self.app = app
        self.max_body = max_body
        self.body_timeout = body_timeout

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        match = ACK_PATH.match(scope["path"])
        if match is None:
            return await self.app(scope, receive, send)
        authorization = None
        for name, value in scope["headers"]:
            if name in BROWSER_HEADERS:
                return await self.app(scope, receive, send)
            if name == b"authorization":
                authorization = value.decode("latin-1")
        chunks, size = [], 0
        while True:
            try:
                message = await receive_within(receive, self.body_timeout)
            except RequestTimeout as exc:
                return await respond(send, exc)
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return await respond(send, too_large(self.max_body, streamed=False))
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        job_id, checkpoint_id = int(match.group(1)), int(match.group(2))
        invalid = _path_problems(job_id, checkpoint_id)
        if invalid is not None:  # validated as the route's path parameters are (the spec's bounds)
            return await _respond(send, *_error(invalid))
        handler = handle_ack_batch if match.group(3) else handle_ack
        try:
            answer = await handler(scope["app"].state, job_id, checkpoint_id, b"".join(chunks), authorization)
        except TransientDatabaseError as exc:
            return await respond(send, exc.unavailable())
        await _respond(send, *answer)


def _path_problems(job_id: int, checkpoint_id: int) -> DomainError | None:
    errors = []
    if not 1 <= job_id <= MAX_ID:
        errors.append({"loc": ["path", "job_id"], "msg": f"Input should be between 1 and {MAX_ID}"})
    if not 0 <= checkpoint_id <= MAX_ID:
        errors.append({"loc": ["path", "checkpoint_id"], "msg": f"Input should be between 0 and {MAX_ID}"})
    return invalid_from(errors) if errors else None


async def _respond(send, status: int, payload: bytes, extra: dict[str, str] | None = None) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def _json_body(model: type) -> dict:
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


@router.post("/checkpoints/{checkpoint_id}/acks", response_model=AckResult, openapi_extra=_json_body(SubtaskAck))
async def ack(job_id: JobId, checkpoint_id: CheckpointId, request: Request) -> Response:
    """A subtask's part of the checkpoint is durable. Answered after the ack is committed; idempotent: the same
    ack again succeeds and changes nothing, a different one is 409. Needs the job's task token (or admin).

    State the subtask wrote into the blob store itself (`written`, through the checkpoint's write target) counts
    only under this checkpoint's prefix of this job (403 for another job's, 422 for another checkpoint's) and only
    once a stat found the object with the stated size (422 naming it otherwise); nothing is recorded then."""
    status, payload, headers = await handle_ack(
        request.app.state, job_id, checkpoint_id, await request.body(), request.headers.get("authorization")
    )
    return Response(payload, status_code=status, headers=headers, media_type="application/json")


@router.post(
    "/checkpoints/{checkpoint_id}/acks/batch", response_model=AckBatchResult, openapi_extra=_json_body(AckBatch)
)
async def ack_batch(job_id: JobId, checkpoint_id: CheckpointId, request: Request) -> Response:
    """Several subtasks' acks in one request (a Spark task hosting a chain); each item has its own status."""
    status, payload, headers = await handle_ack_batch(
        request.app.state, job_id, checkpoint_id, await request.body(), request.headers.get("authorization")
    )
    return Response(payload, status_code=status, headers=headers, media_type="application/json")


REPORT_PARTS = ("ack", "operator_state", "channel_state")
_REPORT_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["ack"],
                    "description": "The parts in this order: ack, then operator_state and channel_state as the "
                    "report declares them. Each blob part is stored while it arrives and verified against the "
                    "sha256 and size the report gives for it.",
                    "properties": {
                        "ack": {"$ref": "#/components/schemas/SubtaskReport"},
                        "operator_state": {"type": "string", "format": "binary", "description": "Operator-state blob."},
                        "channel_state": {"type": "string", "format": "binary", "description": "Channel-state blob."},
                    },
                },
                "encoding": {
                    "ack": {"contentType": "application/json"},
                    "operator_state": {"contentType": "application/octet-stream"},
                    "channel_state": {"contentType": "application/octet-stream"},
                },
            }
        },
    }
}


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
    stream = MultipartStream(request.stream(), request.headers.get("content-type", ""))
    report, stored = await _store_report(ctx, stream, job_id, checkpoint_id)
    refs = {info.kind: BlobRef(blob_id=info.blob_id, sha256=info.sha256, size=info.size) for info, _ in stored}
    ack = report.to_ack(refs.get("operator"), refs.get("channel"))
    (result,) = await request.app.state.committer.submit(job_id, checkpoint_id, [ack])
    if isinstance(result, DomainError):
        await blobs.discard_unacked(ctx, job_id, checkpoint_id, [info.blob_id for info, created in stored if created])
        raise result
    return result


async def _no_more_parts(stream: MultipartStream, declared: list[str]) -> None:
    extra = await stream.next_part()
    if extra is not None:
        if extra.name in REPORT_PARTS:
            raise Invalid(
                f"a {extra.name} part was sent but the report does not declare it (or not in the order ack, "
                f"operator_state, channel_state; declared: {declared or 'no blobs'}); nothing was stored"
            )
        raise Invalid(f"unknown part {extra.name!r}; the parts are {', '.join(REPORT_PARTS)}; nothing was stored")


def _blob_part(stream: MultipartStream, kind: str, size: int, limit: int, declared: list[str], last: bool):
    """The next part's bytes, which must be the `kind` blob of `size` bytes; checked while it arrives."""

    async def chunks():
        part = await stream.next_part()
        name = f"{kind}_state"
        if part is None or part.name != name:
            raise Invalid(
                f"the report declares {name} but "
                + (f"no {name} file part was sent" if part is None else f"the next part is {part.name!r}")
                + " (the parts come in the order ack, operator_state, channel_state); nothing was stored"
            )
        seen = 0
        async for chunk in stream.chunks(limit, f"the {name} part"):
            seen += len(chunk)
            if seen > size:
                raise Invalid(f"the {name} part has more bytes than the report declares {size}; nothing was stored")
            yield chunk
        if seen != size:
            raise Invalid(f"the {name} part has {seen} bytes but the report declares {size}; nothing was stored")
        if last:
            await _no_more_parts(stream, declared)

    return chunks()


async def _store_report(ctx, stream: MultipartStream, job_id: int, checkpoint_id: int):
    """Read the report, then stream its blob parts into the store, checked against it; returns (report, stored)."""
    first = await stream.next_part()
    if first is None or first.name != "ack":
        raise Invalid(
            "the first part must be the 'ack' field (the SubtaskReport as JSON), "
            + ("but the body has no parts" if first is None else f"not {first.name!r}")
        )
    raw = await stream.read(ctx.settings.max_request_body, "the 'ack' part")
    try:
        report = SubtaskReport.model_validate_json(raw)
    except ValidationError as exc:
        raise invalid_from(exc.errors(), ("ack",)) from None
    declared = [kind for kind in ("operator", "channel") if getattr(report, f"{kind}_state") is not None]
    if not declared:
        await _no_more_parts(stream, declared)
    parts = []
    for i, kind in enumerate(declared):
        digest = getattr(report, f"{kind}_state")
        body = _blob_part(stream, kind, digest.size, ctx.settings.max_blob_size, declared, i == len(declared) - 1)
        parts.append((kind, digest.sha256, body))
    stored = await blobs.store(
        ctx, job_id, checkpoint_id, report.attempt, report.vertex, report.subtask_index, parts, from_report=True
    )
    return report, stored
