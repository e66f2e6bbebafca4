"""The ack routes as the API documents them (openapi.yaml): one subtask's ack, a batch of acks, and an ack with its
state in one multipart request, with the rules of its parts. The first two call the handlers of
`app/api/ack_handlers.py`, which the ASGI fast path (`app/api/ack_fastpath.py`) serves before the framework for
every client that is not a browser.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from app.api.ack_handlers import handle_ack, handle_ack_batch
from app.api.deps import TASK, CheckpointId, CtxDep, JobId
from app.api.multipart import MultipartStream
from app.domain import blobs
from app.errors import DomainError, Invalid, invalid_from
from contract.models import (
    AckBatch,
    AckBatchResult,
    AckResult,
    BlobRef,
    SubtaskAck,
    SubtaskReport,
)
from contract.models.base import rules_extra

router = APIRouter(prefix="/api/v1/jobs/{job_id}", tags=["subtasks"])


def _json_body(model: type) -> dict:
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


@router.post("/checkpoints/{checkpoint_id}/acks", response_model=AckResult, openapi_extra={**_json_body(SubtaskAck), **rules_extra(*SubtaskAck.RULES)})
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
    "/checkpoints/{checkpoint_id}/acks/batch",
    response_model=AckBatchResult,
    openapi_extra={**_json_body(AckBatch), **rules_extra(*(f"Each ack: {rule}" for rule in SubtaskAck.RULES))},
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
    openapi_extra={**_REPORT_BODY, **rules_extra(*SubtaskReport.RULES)},
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
