"""The ack worker: sends a subtask's acks (with their state, written straight into the blob store or uploaded
through the coordinator) and its declines off the subtask loop, in order, on one background thread, retrying
through a coordinator outage (``spark_plugin.task.coordination``)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from client.errors import InvalidRequest, NotFound
from contract.models import ChannelSegment, WriteTarget
from spark_plugin.task.coordination import (
    DEFAULT_MAX_OUTAGE,
    TRANSIENT,
    Backoff,
    CheckpointDiscarded,
    CheckpointReporter,
    CoordinatorLost,
)
from spark_plugin.task.state_store import StateTargets, StateWriter

log = logging.getLogger("overtake.subtask")

TARGET_WAIT = 30.0
"""Seconds the ack worker waits for a checkpoint's write target (its trigger event) before it uploads the state
through the coordinator instead."""


@dataclass
class CheckpointUpload:
    """Everything an ack needs, handed from the loop to the :class:`AckWorker`."""

    checkpoint_id: int
    operator_state: bytes | None
    channel_state: bytes | None
    channel_segments: list[ChannelSegment]
    source_offsets: dict | None
    key_group_range: tuple[int, int] | None
    metrics: dict[str, Any]
    whole: Callable[[], tuple[bytes | None, list[ChannelSegment]]] | None = None
    """The channel state with every buffer written again, when ``channel_segments`` reference earlier objects: for
    a checkpoint whose state goes through the coordinator, or whose references the coordinator refused."""
    on_written: Callable[[str, bool], None] | None = None
    """Told the key of the object written for the checkpoint when later checkpoints may reference it, and whether
    its channel state was laid out whole again."""
    handed_over: float = field(default_factory=time.monotonic)
    """When the loop handed it over (``time.monotonic``): the async part of the checkpoint counts from here."""
    result: dict[str, Any] = field(default_factory=dict)


def _metrics(up: CheckpointUpload, durable: bool = True) -> dict[str, Any]:
    """The ack's metrics as it is sent: async_duration from the hand-over until now and, once its state is durable
    (`durable`), the subtask's own ack time (a host's relay sends its subtasks' acks together; the coordinator
    records each one's own time). An ack that carries its state is durable only on its arrival, which the
    coordinator records."""
    metrics = dict(up.metrics, async_duration=int((time.monotonic() - up.handed_over) * 1000))
    if durable:
        metrics["ack_timestamp"] = int(time.time() * 1000)
    return metrics


class AckWorker:
    """Sends acks (with their state blobs) and declines off the subtask loop, in order, on one background thread.

    With ``targets`` and a ``writer``, a checkpoint whose trigger came with a write target has its state written
    straight into the blob store and acked by its handle; otherwise it is uploaded with the ack, through the
    coordinator. A request that fails because the coordinator (or the store) is unreachable is sent again with
    backoff until it succeeds, is refused for good, or its checkpoint is discarded; past ``max_outage`` the worker
    stops and ``failure`` says why (the subtask then fails).
    """

    def __init__(
        self,
        reporter: CheckpointReporter,
        max_outage: float = DEFAULT_MAX_OUTAGE,
        on_done: Callable[[CheckpointUpload], None] | None = None,
        sleep=time.sleep,
        targets: StateTargets | None = None,
        writer: StateWriter | None = None,
        target_wait: float = TARGET_WAIT,
    ) -> None:
        self.targets = targets
        self.writer = writer
        self.target_wait = target_wait
        self.reporter = reporter
        self.on_done = on_done
        self.sleep = sleep
        self.backoff = Backoff(max_outage)
        self._queue: queue.Queue = queue.Queue()
        self._discarded: set[int] = set()
        self.acked: list[int] = []
        self.declined: list[int] = []
        self.errors: list[str] = []
        self.failure: str | None = None
        self._thread = threading.Thread(target=self._run, name="ack-worker", daemon=True)
        self._thread.start()

    def submit(self, upload: CheckpointUpload) -> None:
        self._queue.put(("ack", upload))

    def decline(self, checkpoint_id: int, reason: str) -> None:
        self._queue.put(("decline", (checkpoint_id, reason)))

    def request_checkpoint(self) -> None:
        self._queue.put(("request", None))

    def report_running(self) -> None:
        self._queue.put(("running", None))

    def discard(self, checkpoint_id: int) -> None:
        """The checkpoint was aborted: skip its queued ack, or stop retrying it."""
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
                if kind == "ack":
                    self._send(item.checkpoint_id, lambda item=item: self._ack(item))
                elif kind == "decline":
                    cid, reason = item
                    self._send(None, lambda cid=cid, reason=reason: self.reporter.decline(cid, reason))
                    self.declined.append(cid)
                elif kind == "running":
                    self._send(None, self.reporter.report_running)
                else:
                    self.reporter.request_checkpoint()  # not retried: the source asks again
            except CoordinatorLost as e:
                self.failure = str(e)
                log.error("%s", e)
                return
            except NotFound as e:
                # the coordinator does not know this subtask (or its job): the run does not match its attempt,
                # and no checkpoint could ever complete with it; fail loudly instead of acknowledging into the void
                self.failure = f"the coordinator refused an acknowledgement: {e}"
                log.error("%s", self.failure)
                return
            except CheckpointDiscarded as e:
                log.info("checkpoint discarded by the coordinator: %s", e)
            except Exception as e:  # noqa: BLE001 - a refused report must not kill the subtask
                log.warning("reporting a checkpoint failed: %s", e)
                self.errors.append(f"{type(e).__name__}: {e}")

    def _send(self, checkpoint_id: int | None, request: Callable[[], None]) -> bool:
        """Run ``request`` until it succeeds (True) or, for an ack, its checkpoint is discarded (False)."""
        while checkpoint_id is None or checkpoint_id not in self._discarded:
            try:
                request()
            except TRANSIENT as e:
                self.sleep(self.backoff.failed(f"checkpoint {checkpoint_id}", e))
                continue
            self.backoff.ok()
            return True
        return False

    def _target(self, checkpoint_id: int) -> WriteTarget | None:
        if self.targets is None or self.writer is None:
            return None
        known, target = self.targets.wait(checkpoint_id, self.target_wait)
        if not known:
            log.warning("checkpoint %s: no trigger event within %.0fs; its state goes through the coordinator",
                        checkpoint_id, self.target_wait)
        return target

    @staticmethod
    def _write_whole(up: CheckpointUpload, body: dict[str, Any]) -> None:
        """Lay the upload's channel state out with every buffer in it (no references)."""
        assert up.whole is not None
        data, segments = up.whole()
        up.channel_state, up.channel_segments, up.whole = data, segments, None
        body["channel_segments"] = [s.model_dump(mode="json") for s in segments]

    def _ack(self, up: CheckpointUpload) -> None:
        body: dict[str, Any] = {
            "channel_segments": [s.model_dump(mode="json") for s in up.channel_segments],
            "source_offsets": up.source_offsets,
        }
        if up.key_group_range is not None:
            body["key_group_start"], body["key_group_end"] = up.key_group_range
        target = self._target(up.checkpoint_id)
        if up.whole is not None and (target is None or not target.incremental):
            self._write_whole(up, body)
        if target is not None:
            assert self.writer is not None
            written = self.writer.write(target, up.operator_state, up.channel_state or None)
            body["written"] = written.model_dump(mode="json")
            # async_duration: from the hand-over until the state is durable in the store
            body["metrics"] = _metrics(up)
            if target.incremental and up.on_written is not None:
                up.on_written(written.key, False)
            try:
                self.reporter.ack(up.checkpoint_id, body)
            except InvalidRequest as e:
                if up.whole is None:
                    raise
                # an object it references is no longer kept (the checkpoint that kept it was collected): write
                # every buffer again, under the same name, and ack that
                log.info("checkpoint %s: references refused (%s); writing its channel state whole", up.checkpoint_id, e)
                self._write_whole(up, body)
                written = self.writer.write(target, up.operator_state, up.channel_state or None)
                body["written"] = written.model_dump(mode="json")
                body["metrics"] = _metrics(up)
                if up.on_written is not None:
                    up.on_written(written.key, True)
                self.reporter.ack(up.checkpoint_id, body)
        else:
            # async_duration: up to the one request that carries the blobs and the ack (the coordinator's part of
            # making them durable is the ack's own latency)
            body["metrics"] = _metrics(up, durable=False)
            self.reporter.ack_with_state(up.checkpoint_id, body, up.operator_state, up.channel_state or None)
        up.result = body
        self.acked.append(up.checkpoint_id)
        if self.on_done is not None:
            self.on_done(up)

