"""The two ack handlers, shared by the ASGI fast path (`app/api/ack_fastpath.py`) and the FastAPI routes that
document them (`app/api/acks.py`): each takes the raw body and the Authorization header and returns (status, JSON
bytes, headers), so behaviour, errors and auth are the same on both paths."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from app.domain import written
from app.errors import DomainError, error_json, invalid_from
from contract.models import AckBatch, AckBatchItem, AckBatchResult, SubtaskAck


def error_answer(exc: DomainError) -> tuple[int, bytes, dict[str, str]]:
    """The error's answer, with its headers (a 503's Retry-After)."""
    return exc.status_code, error_json(exc), exc.headers


def _invalid(exc: ValidationError) -> tuple[int, bytes, dict[str, str]]:
    return error_answer(invalid_from(exc.errors(), ("body",)))


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
                return error_answer(check.refusal)
            missing = [check.missing]
        (result,) = await state.committer.submit(job_id, checkpoint_id, [ack], token_attempt, missing)
    except ValidationError as exc:
        return _invalid(exc)
    except DomainError as exc:
        return error_answer(exc)
    if isinstance(result, DomainError):
        return error_answer(result)
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
        return error_answer(exc)
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
