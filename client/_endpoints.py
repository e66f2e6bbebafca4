"""The coordinator's routes, written once: each method builds a ``Call`` (request and response parser) and hands
it to ``self._send``, which the sync client runs and returns, and the async client returns as a coroutine.

So ``OvertakeClient.get_job(7)`` returns a ``Job`` and ``await AsyncOvertakeClient.get_job(7)`` does too; the
return annotations below name what a call resolves to.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Literal, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from client._http import API, Call
from client._upload import BlobData, prepare_blob
from client.errors import InvalidRequest
from contract.models import (
    AckBatch,
    AckBatchResult,
    AckResult,
    AfterAttempt,
    Attempt,
    AttemptCreate,
    AttemptPage,
    BarrierPolicy,
    BlobInfo,
    ChannelStateManifest,
    Checkpoint,
    CheckpointDetail,
    CheckpointPage,
    CheckpointStatistics,
    CheckpointStatus,
    CorruptBlob,
    Decline,
    Event,
    ExternalCheckpoint,
    Job,
    JobCreate,
    JobFinish,
    JobLiveMetrics,
    JobPage,
    JobStatus,
    RestorePlan,
    RunningReport,
    RunningState,
    SavepointRequest,
    SubtaskAck,
    SubtaskMetrics,
    SubtaskMetricsBatch,
    SubtaskMetricsBatchItem,
    SubtaskMetricsBatchResult,
    SubtaskMetricsReport,
    SubtaskReport,
    TriggerRequest,
)

M = TypeVar("M", bound=BaseModel)

_EVENTS = TypeAdapter(list[Event])


def _model(cls: type[M]):
    def parse(response: httpx.Response) -> M:
        return cls.model_validate_json(response.content)

    return parse


def _events(response: httpx.Response) -> list[Event]:
    return _EVENTS.validate_json(response.content)


def _json(response: httpx.Response) -> Any:
    return response.json()


def _bytes(response: httpx.Response) -> bytes:
    return response.content


def _body(cls: type[BaseModel], value: BaseModel | dict[str, Any]) -> dict[str, Any]:
    """The JSON body of a request model; a dict is validated first, so mistakes are found before sending."""
    try:
        model = value if isinstance(value, cls) else cls.model_validate(value)
    except ValidationError as exc:
        raise InvalidRequest(None, "invalid", f"invalid {cls.__name__}: {exc}", exc.errors()) from exc
    return model.model_dump(mode="json")


def _query(**params: Any) -> dict[str, Any]:
    """Query parameters without the unset ones; enums as their values."""
    return {k: getattr(v, "value", v) for k, v in params.items() if v is not None}


def _job(job_id: int) -> str:
    return f"{API}/jobs/{int(job_id)}"


def _checkpoint(job_id: int, checkpoint_id: int) -> str:
    return f"{_job(job_id)}/checkpoints/{int(checkpoint_id)}"


class Endpoints:
    """Every route of docs/api.md except the event stream (which needs a loop of its own per client)."""

    def _send(self, call: Call[Any]) -> Any:  # pragma: no cover - provided by the clients
        raise NotImplementedError

    # ----------------------------------------------------------------------------------------- jobs

    def create_job(self, job: JobCreate | dict[str, Any]) -> Job:
        return self._send(
            Call("POST", f"{API}/jobs", _model(Job), json=_body(JobCreate, job), idempotent=False)
        )

    def list_jobs(
        self,
        status: JobStatus | str | None = None,
        limit: int = 50,
        offset: int = 0,
        label: str | None = None,
    ) -> JobPage:
        """Jobs, newest first; ``label="key=value"`` keeps those with that label."""
        params = _query(status=status, limit=limit, offset=offset, label=label)
        return self._send(Call("GET", f"{API}/jobs", _model(JobPage), params=params))

    def get_job(self, job_id: int) -> Job:
        return self._send(Call("GET", _job(job_id), _model(Job)))

    def cancel_job(self, job_id: int) -> Job:
        return self._send(Call("POST", f"{_job(job_id)}/cancel", _model(Job)))

    def finish_job(
        self,
        job_id: int,
        status: Literal["FINISHED", "FAILED"],
        message: str | None = None,
        attempt: int | None = None,
    ) -> Job:
        body = _body(
            JobFinish, {"status": getattr(status, "value", status), "message": message, "attempt": attempt}
        )
        return self._send(Call("POST", f"{_job(job_id)}/finish", _model(Job), json=body))

    def start_attempt(
        self,
        job_id: int,
        restore_from: int | Literal["latest"] | AfterAttempt | None = "latest",
        *,
        parallelism: dict[str, int] | None = None,
        wait_for_running: bool = False,
        reason: str | None = None,
    ) -> Attempt:
        """Open a new attempt; its ``task_token`` is shown only here (see ``with_token``).

        ``restore_from``: a checkpoint or savepoint id, ``"latest"`` (the latest completed, if any),
        ``AfterAttempt(n)`` (where the current attempt ``n`` left off, chosen by the coordinator as the attempt
        opens: the plan's ``requested_checkpoint``) or None (a fresh start). With ``wait_for_running``, periodic checkpoints start one interval after every subtask
        called ``report_running`` (or after the coordinator's grace period). ``reason`` says why the attempt starts
        (the job's status message while it runs)."""
        try:
            body = AttemptCreate.restoring(
                restore_from, parallelism=parallelism, wait_for_running=wait_for_running, reason=reason
            )
        except (ValueError, ValidationError) as exc:
            raise InvalidRequest(None, "invalid", f"invalid attempt: {exc}") from exc
        return self._send(
            Call(
                "POST",
                f"{_job(job_id)}/attempts",
                _model(Attempt),
                json=body.model_dump(mode="json", exclude_defaults=True),
                idempotent=False,
            )
        )

    def report_running(self, job_id: int, attempt: int, vertex: str, subtask_index: int) -> RunningState:
        """Tell the coordinator that this subtask of ``attempt`` runs (idempotent, so retried). Once every subtask
        did, the attempt's periodic checkpoints count their interval from then (see ``start_attempt``)."""
        body = _body(RunningReport, {"vertex": vertex, "subtask_index": subtask_index})
        path = f"{_job(job_id)}/attempts/{int(attempt)}/running"
        return self._send(Call("POST", path, _model(RunningState), json=body))

    def list_attempts(self, job_id: int, limit: int = 50, offset: int = 0) -> AttemptPage:
        """The job's attempts, newest first: what each restored, passed over (and why) and rescaled."""
        params = _query(limit=limit, offset=offset)
        return self._send(Call("GET", f"{_job(job_id)}/attempts", _model(AttemptPage), params=params))

    def report_metrics(
        self,
        job_id: int,
        attempt: int,
        vertex: str,
        subtask_index: int,
        metrics: SubtaskMetrics | dict[str, Any],
        timestamp: int | None = None,
    ) -> None:
        """A running subtask's latest metrics, measured at ``timestamp`` (ms since the epoch; default now).
        Idempotent: the coordinator keeps the newest report of each subtask by timestamp."""
        when = int(time.time() * 1000) if timestamp is None else timestamp
        body = _body(SubtaskMetricsReport, {"timestamp": when, "metrics": metrics})
        path = f"{_job(job_id)}/attempts/{int(attempt)}/subtasks/{vertex}/{int(subtask_index)}/metrics"
        return self._send(Call("POST", path, lambda r: None, json=body))

    def report_metrics_batch(
        self, job_id: int, attempt: int, reports: list[SubtaskMetricsBatchItem | dict[str, Any]]
    ) -> SubtaskMetricsBatchResult:
        """Several subtasks' latest metrics of one attempt in one request, each with its own ``vertex``,
        ``subtask_index``, ``timestamp`` and ``metrics``; the result says per report whether it was kept."""
        body = _body(SubtaskMetricsBatch, {"reports": reports})
        path = f"{_job(job_id)}/attempts/{int(attempt)}/metrics/batch"
        return self._send(Call("POST", path, _model(SubtaskMetricsBatchResult), json=body))

    def live_metrics(self, job_id: int) -> JobLiveMetrics:
        """Per vertex of the job's current attempt: records/s, backpressure, and the low watermark with its lag from
        its subtasks' reports."""
        return self._send(Call("GET", f"{_job(job_id)}/metrics", _model(JobLiveMetrics)))

    # ----------------------------------------------------------------------------------------- checkpoints

    def trigger_checkpoint(self, job_id: int, policy: BarrierPolicy | str | None = None) -> Checkpoint:
        body = _body(TriggerRequest, {"policy": policy})
        return self._send(
            Call("POST", f"{_job(job_id)}/checkpoints", _model(Checkpoint), json=body, idempotent=False)
        )

    def trigger_savepoint(self, job_id: int, stop: bool = False) -> Checkpoint:
        body = _body(SavepointRequest, {"stop": stop})
        return self._send(
            Call("POST", f"{_job(job_id)}/savepoints", _model(Checkpoint), json=body, idempotent=False)
        )

    def list_checkpoints(
        self,
        job_id: int,
        status: CheckpointStatus | str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> CheckpointPage:
        params = _query(status=status, limit=limit, offset=offset)
        return self._send(Call("GET", f"{_job(job_id)}/checkpoints", _model(CheckpointPage), params=params))

    def report_checkpoint(self, job_id: int, body: ExternalCheckpoint | dict[str, Any]) -> Checkpoint:
        """Record a checkpoint the engine completed on its own (e.g. a micro-batch, keyed by its batch id).

        Idempotent, so retried: the same report again changes nothing; a different one for a recorded id, or an
        id below the job's next id, is a ``Conflict``."""
        path = f"{_job(job_id)}/checkpoints/external"
        return self._send(Call("POST", path, _model(Checkpoint), json=_body(ExternalCheckpoint, body)))

    def checkpoint_stats(self, job_id: int) -> CheckpointStatistics:
        return self._send(Call("GET", f"{_job(job_id)}/checkpoints/stats", _model(CheckpointStatistics)))

    def get_checkpoint(self, job_id: int, checkpoint_id: int) -> CheckpointDetail:
        return self._send(Call("GET", _checkpoint(job_id, checkpoint_id), _model(CheckpointDetail)))

    def channel_state(self, job_id: int, checkpoint_id: int) -> ChannelStateManifest:
        path = f"{_checkpoint(job_id, checkpoint_id)}/channel-state"
        return self._send(Call("GET", path, _model(ChannelStateManifest)))

    # ----------------------------------------------------------------------------------------- blobs

    def upload_blob(
        self,
        job_id: int,
        checkpoint_id: int,
        *,
        attempt: int,
        vertex: str,
        subtask_index: int,
        kind: Literal["operator", "channel"],
        data: BlobData,
    ) -> BlobInfo:
        """Upload one subtask's state blob. Safe to retry: the coordinator stores identical content once."""
        if kind not in ("operator", "channel"):
            raise InvalidRequest(None, "invalid", f"blob kind must be 'operator' or 'channel', got {kind!r}")
        blob = prepare_blob(data)
        headers = {
            "X-Overtake-Sha256": blob.sha256,
            "Content-Type": "application/octet-stream",
            "Content-Length": str(blob.body.size),
        }
        params = {"attempt": attempt, "vertex": vertex, "subtask_index": subtask_index, "kind": kind}
        path = f"{_checkpoint(job_id, checkpoint_id)}/blobs"
        return self._send(
            Call("POST", path, _model(BlobInfo), params=params, body=blob.body, headers=headers)
        )

    def download_blob(
        self, job_id: int, blob_id: str, start: int | None = None, end: int | None = None
    ) -> bytes:
        """The blob's bytes, or bytes ``start``..``end`` of it (both inclusive, as in an HTTP Range)."""
        headers = {"Accept": "application/octet-stream"}
        if start is not None or end is not None:
            first = start or 0
            if first < 0 or (end is not None and end < first):
                raise InvalidRequest(None, "invalid", f"invalid byte range start={start!r} end={end!r}")
            headers["Range"] = f"bytes={first}-{'' if end is None else end}"
        return self._send(Call("GET", f"{_job(job_id)}/blobs/{blob_id}", _bytes, headers=headers))

    def report_corrupt_blob(
        self,
        job_id: int,
        blob_id: str,
        *,
        attempt: int,
        vertex: str,
        subtask_index: int,
        reason: str,
    ) -> BlobInfo:
        """A restoring subtask read a blob whose bytes do not match its sha256: the coordinator marks it corrupt, so
        the next attempt's restore plan falls back past its checkpoint (naming the blob and this subtask). Only
        the current attempt reports; idempotent, so retried (a blob stays marked as first reported)."""
        body = _body(
            CorruptBlob, {"attempt": attempt, "vertex": vertex, "subtask_index": subtask_index, "reason": reason}
        )
        return self._send(Call("POST", f"{_job(job_id)}/blobs/{blob_id}/corrupt", _model(BlobInfo), json=body))

    # ----------------------------------------------------------------------------------------- acks

    def ack(self, job_id: int, checkpoint_id: int, ack: SubtaskAck | dict[str, Any]) -> AckResult:
        path = f"{_checkpoint(job_id, checkpoint_id)}/acks"
        return self._send(Call("POST", path, _model(AckResult), json=_body(SubtaskAck, ack)))

    def ack_with_state(
        self,
        job_id: int,
        checkpoint_id: int,
        ack: SubtaskReport | dict[str, Any],
        *,
        operator_state: bytes | None = None,
        channel_state: bytes | None = None,
    ) -> AckResult:
        """A subtask's state blobs and its ack in one request (instead of two uploads and an ack). ``ack`` holds
        the ack's fields (attempt, vertex, subtask_index, channel_segments, ...); the blobs' sha256 and sizes are
        filled in here. Safe to retry: nothing is stored twice, and the same ack again answers ``duplicate``."""
        blob_fields = {"operator_state", "channel_state", "written"}  # filled in below from the bytes sent
        if isinstance(ack, BaseModel):
            fields = ack.model_dump(mode="json", exclude=blob_fields)
        else:
            fields = {k: v for k, v in ack.items() if k not in blob_fields}
        blobs: dict[str, Any] = {}
        for kind, data in (("operator_state", operator_state), ("channel_state", channel_state)):
            if data is not None:
                data = bytes(data)
                fields[kind] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
                blobs[kind] = (kind, data, "application/octet-stream")
        report = json.dumps(_body(SubtaskReport, fields)).encode()
        # the report as a field part (no file name) first, then the blobs as file parts
        files = {"ack": (None, report, "application/json"), **blobs}
        path = f"{_checkpoint(job_id, checkpoint_id)}/acks/with-state"
        return self._send(Call("POST", path, _model(AckResult), files=files))

    def ack_batch(
        self, job_id: int, checkpoint_id: int, acks: list[SubtaskAck] | list[dict[str, Any]]
    ) -> AckBatchResult:
        path = f"{_checkpoint(job_id, checkpoint_id)}/acks/batch"
        return self._send(
            Call("POST", path, _model(AckBatchResult), json=_body(AckBatch, {"acks": list(acks)}))
        )

    def decline(self, job_id: int, checkpoint_id: int, decline: Decline | dict[str, Any]) -> Checkpoint:
        path = f"{_checkpoint(job_id, checkpoint_id)}/declines"
        return self._send(Call("POST", path, _model(Checkpoint), json=_body(Decline, decline)))

    # ----------------------------------------------------------------------------------------- recovery, events

    def restore_plan(self, job_id: int, checkpoint_id: int | None = None) -> RestorePlan:
        params = _query(checkpoint_id=checkpoint_id)
        return self._send(Call("GET", f"{_job(job_id)}/restore-plan", _model(RestorePlan), params=params))

    def event_history(self, job_id: int, after: int | None = None, limit: int = 1000) -> list[Event]:
        params = _query(after=after, limit=limit)
        return self._send(Call("GET", f"{_job(job_id)}/events/history", _events, params=params))

    def health(self) -> dict[str, Any]:
        return self._send(Call("GET", "/healthz", _json))
