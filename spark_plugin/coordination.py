"""The runtime's boundary to the coordinator: a reporter for blobs, acks and declines, and the event feed.

Subtasks only see :class:`CheckpointReporter` and :class:`CoordinatorEvents`; :class:`SdkReporter` and
:func:`sdk_events` implement them with the SDK (``client.sync.OvertakeClient``), and tests use in-memory fakes.
:class:`AckWorker` runs uploads and acks on a background thread so the subtask loop never waits for them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger("overtake.subtask")


@dataclass
class BlobHandle:
    blob_id: str
    sha256: str
    size: int


class CheckpointReporter(Protocol):
    """Reports one subtask's part of checkpoints to the coordinator.

    A reporter that also has ``ack_with_state(checkpoint_id, ack, operator_state, channel_state)`` gets the blobs
    and the ack in one call (the SDK reporter: one request); otherwise each blob is uploaded, then acked.
    """

    def upload(self, checkpoint_id: int, kind: str, data: bytes) -> BlobHandle: ...

    def ack(self, checkpoint_id: int, ack: dict[str, Any]) -> None:
        """Send a ``SubtaskAck`` (as a dict, without attempt/vertex/subtask which the reporter adds)."""

    def decline(self, checkpoint_id: int, reason: str) -> None: ...

    def request_checkpoint(self) -> None:
        """Ask the coordinator for a checkpoint now (a source's final checkpoint); a refusal is fine."""


class CheckpointDiscarded(Exception):
    """The coordinator no longer wants this checkpoint (aborted, subsumed): drop the work."""


@dataclass
class TaskIdentity:
    job_id: int
    attempt: int
    vertex: str
    subtask_index: int


class SdkReporter:
    """:class:`CheckpointReporter` through the SDK's ``OvertakeClient`` (authenticated with the task token)."""

    def __init__(self, client: Any, who: TaskIdentity) -> None:
        self.client = client
        self.who = who

    def upload(self, checkpoint_id: int, kind: str, data: bytes) -> BlobHandle:
        from client.errors import Conflict

        w = self.who
        try:
            info = self.client.upload_blob(
                w.job_id, checkpoint_id, attempt=w.attempt, vertex=w.vertex, subtask_index=w.subtask_index,
                kind=kind, data=data,
            )
        except Conflict as e:
            raise CheckpointDiscarded(str(e)) from e
        return BlobHandle(info.blob_id, info.sha256, info.size)

    def ack(self, checkpoint_id: int, ack: dict[str, Any]) -> None:
        from client.errors import Conflict
        from client.models import SubtaskAck

        w = self.who
        body = SubtaskAck(attempt=w.attempt, vertex=w.vertex, subtask_index=w.subtask_index, **ack)
        try:
            self.client.ack(w.job_id, checkpoint_id, body)
        except Conflict as e:
            raise CheckpointDiscarded(str(e)) from e

    def ack_with_state(
        self, checkpoint_id: int, ack: dict[str, Any], operator_state: bytes | None, channel_state: bytes | None
    ) -> None:
        """The blobs and the ack in one request (one round trip and one transaction less per blob)."""
        from client.errors import Conflict

        w = self.who
        report = {"attempt": w.attempt, "vertex": w.vertex, "subtask_index": w.subtask_index, **ack}
        try:
            self.client.ack_with_state(
                w.job_id, checkpoint_id, report, operator_state=operator_state, channel_state=channel_state
            )
        except Conflict as e:
            raise CheckpointDiscarded(str(e)) from e

    def decline(self, checkpoint_id: int, reason: str) -> None:
        from client.errors import Conflict, NotFound
        from client.models import Decline

        w = self.who
        try:
            self.client.decline(
                w.job_id, checkpoint_id,
                Decline(attempt=w.attempt, vertex=w.vertex, subtask_index=w.subtask_index, reason=reason[:2000]),
            )
        except (Conflict, NotFound):
            pass  # already aborted or completed: nothing to decline

    def request_checkpoint(self) -> None:
        from client.errors import Conflict

        try:
            self.client.trigger_checkpoint(self.who.job_id)
        except Conflict:
            pass  # one is pending or the pause has not passed: the next request or the scheduler will do


class CoordinatorEvents(Protocol):
    """An iterator of the job's events as ``(type, data)``; ``close`` ends it from another thread."""

    def __iter__(self) -> Iterator[tuple[str, dict]]: ...

    def close(self) -> None: ...


class SdkEvents:
    """The job's SSE stream through the SDK, starting after event id ``after``."""

    def __init__(self, client: Any, job_id: int, after: int | None) -> None:
        self.client = client
        self.job_id = job_id
        self.after = after
        self.closed = False

    def __iter__(self) -> Iterator[tuple[str, dict]]:
        try:
            for ev in self.client.events(self.job_id, after=self.after):
                if self.closed:
                    return
                yield (ev.type.value if hasattr(ev.type, "value") else str(ev.type)), ev.data
        except Exception:  # noqa: BLE001 - closing the client from another thread ends the stream
            if not self.closed:
                raise

    def close(self) -> None:
        self.closed = True
        try:
            self.client.close()
        except Exception:  # noqa: BLE001
            pass


@dataclass
class CheckpointUpload:
    """Everything an ack needs, handed from the loop to the :class:`AckWorker`."""

    checkpoint_id: int
    operator_state: bytes | None
    channel_state: bytes | None
    channel_segments: list[dict]
    source_offsets: dict | None
    key_group_range: tuple[int, int] | None
    metrics: dict[str, Any]
    ready_ms: int = 0
    result: dict[str, Any] = field(default_factory=dict)


class AckWorker:
    """Uploads state and acks (or declines) off the subtask loop, in order, on one background thread."""

    def __init__(self, reporter: CheckpointReporter, on_done: Callable[[CheckpointUpload], None] | None = None):
        self.reporter = reporter
        self.on_done = on_done
        self._queue: queue.Queue = queue.Queue()
        self._discarded: set[int] = set()
        self.acked: list[int] = []
        self.declined: list[int] = []
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="ack-worker", daemon=True)
        self._thread.start()

    def submit(self, upload: CheckpointUpload) -> None:
        self._queue.put(("ack", upload))

    def decline(self, checkpoint_id: int, reason: str) -> None:
        self._queue.put(("decline", (checkpoint_id, reason)))

    def request_checkpoint(self) -> None:
        self._queue.put(("request", None))

    def discard(self, checkpoint_id: int) -> None:
        """The checkpoint was aborted: skip its queued upload if it has not started."""
        self._discarded.add(checkpoint_id)

    def close(self, timeout: float = 30.0) -> bool:
        """Finish queued work (up to ``timeout`` seconds); True when everything was sent."""
        self._queue.put(("stop", None))
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            kind, item = self._queue.get()
            if kind == "stop":
                return
            try:
                if kind == "decline":
                    cid, reason = item
                    self.reporter.decline(cid, reason)
                    self.declined.append(cid)
                elif kind == "request":
                    self.reporter.request_checkpoint()
                else:
                    self._ack(item)
            except CheckpointDiscarded as e:
                log.info("checkpoint discarded by the coordinator: %s", e)
            except Exception as e:  # noqa: BLE001 - a failed report must not kill the subtask
                log.warning("reporting a checkpoint failed: %s", e)
                self.errors.append(f"{type(e).__name__}: {e}")

    def _ack(self, up: CheckpointUpload) -> None:
        cid = up.checkpoint_id
        if cid in self._discarded:
            return
        t0 = time.monotonic()
        body: dict[str, Any] = {"channel_segments": up.channel_segments, "source_offsets": up.source_offsets}
        if up.key_group_range is not None:
            body["key_group_start"], body["key_group_end"] = up.key_group_range
        metrics = dict(up.metrics)
        combined = getattr(self.reporter, "ack_with_state", None)
        if combined is not None:
            # async_duration: what the subtask did before the one request that carries blobs and ack
            metrics["async_duration"] = int((time.monotonic() - t0) * 1000)
            body["metrics"] = metrics
            combined(cid, body, up.operator_state, up.channel_state or None)
        else:
            if up.operator_state is not None:
                h = self.reporter.upload(cid, "operator", up.operator_state)
                body["operator_state"] = {"blob_id": h.blob_id, "sha256": h.sha256, "size": h.size}
            if up.channel_state:
                h = self.reporter.upload(cid, "channel", up.channel_state)
                body["channel_state"] = {"blob_id": h.blob_id, "sha256": h.sha256, "size": h.size}
            metrics["async_duration"] = int((time.monotonic() - t0) * 1000)
            body["metrics"] = metrics
            if cid in self._discarded:
                return
            self.reporter.ack(cid, body)
        up.result = body
        self.acked.append(cid)
        if self.on_done is not None:
            self.on_done(up)
