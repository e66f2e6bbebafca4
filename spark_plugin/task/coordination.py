"""The subtask's boundary to the coordinator: the reporter of acks and declines, the event feed, and the ack worker.

Subtasks only see :class:`CheckpointReporter` and :class:`CoordinatorEvents`; :class:`SdkReporter` and
:class:`SdkEvents` implement them with the SDK (``client.sync.OvertakeClient``, authenticated with the attempt's task
token), and tests use in-memory fakes. :class:`AckWorker` sends acks and declines off the subtask loop, in order.

A coordinator may be down for a while (a crash, a restart, a failover): the event feed reconnects and resumes after
the last event it saw, and the ack worker retries what failed, both with capped backoff, until the request succeeds,
the coordinator refuses it for good, or its checkpoint is aborted. An outage longer than ``max_outage`` seconds
fails the subtask (so the supervisor restarts the pipeline) instead of waiting forever.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import httpx

from client.errors import (
    Conflict,
    CoordinatorUnreachable,
    Forbidden,
    InvalidRequest,
    NotFound,
    OutcomeUnknown,
    Unauthorized,
    Unavailable,
)
from contract.events import EventPayload, payload_of
from contract.models import ChannelSegment, Decline, SubtaskAck, WriteTarget
from spark_plugin.task.state_store import StateTargets, StateWriter

log = logging.getLogger("overtake.subtask")

TRANSIENT = (CoordinatorUnreachable, Unavailable, httpx.TransportError)
"""Errors of a coordinator (or a blob store) that is down or overloaded: the request is sent again."""

TARGET_WAIT = 30.0
"""Seconds the ack worker waits for a checkpoint's write target (its trigger event) before it uploads the state
through the coordinator instead."""

T = TypeVar("T")

DEFAULT_MAX_OUTAGE = 120.0
"""Seconds a subtask keeps retrying an unreachable coordinator before it fails."""


class CheckpointDiscarded(Exception):
    """The coordinator no longer wants this checkpoint (aborted, subsumed): drop the work."""


class CoordinatorLost(RuntimeError):
    """The coordinator stayed unreachable longer than the subtask may wait."""


class AttemptEnded(RuntimeError):
    """The coordinator no longer accepts this attempt's token: the attempt or the job ended."""


class CheckpointReporter(Protocol):
    """Reports one subtask's part of checkpoints to the coordinator: an ack naming state the subtask wrote into the
    blob store (``ack``), or an ack carrying the state blobs through the coordinator (``ack_with_state``)."""

    def ack(self, checkpoint_id: int, ack: dict[str, Any]) -> None:
        """Send a ``SubtaskAck`` (as a dict, without attempt/vertex/subtask, which the reporter adds); raises
        :class:`CheckpointDiscarded` when the coordinator refuses it for good."""

    def ack_with_state(
        self, checkpoint_id: int, ack: dict[str, Any], operator_state: bytes | None, channel_state: bytes | None
    ) -> None:
        """Send a ``SubtaskReport`` (as a dict, without attempt/vertex/subtask, which the reporter adds) with its
        blobs; raises :class:`CheckpointDiscarded` when the coordinator refuses it for good."""

    def decline(self, checkpoint_id: int, reason: str) -> None: ...

    def request_checkpoint(self) -> None:
        """Ask the coordinator for a checkpoint now (a source's final checkpoint); a refusal is fine."""

    def report_running(self) -> None:
        """Tell the coordinator the subtask runs (and replayed what it restored): checkpoints may start."""


class CoordinatorEvents(Protocol):
    """The job's events as typed payloads; ``close`` ends the iteration from another thread."""

    def __iter__(self) -> Iterator[EventPayload]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class SubtaskIdentity:
    job_id: int
    attempt: int
    vertex: str
    subtask_index: int


class SdkReporter:
    """:class:`CheckpointReporter` through the SDK's ``OvertakeClient``; with a ``metrics_client`` it also sends
    the subtask's live metrics (``spark_plugin.task.metrics``) through that one."""

    def __init__(self, client: Any, who: SubtaskIdentity, metrics_client: Any | None = None) -> None:
        self.client = client
        self.who = who
        if metrics_client is not None:
            self.metrics_client = metrics_client
            self.report_metrics = self._report_metrics

    def _report_metrics(self, metrics: dict[str, Any], timestamp: int) -> None:
        w = self.who
        self.metrics_client.report_metrics(w.job_id, w.attempt, w.vertex, w.subtask_index, metrics, timestamp)

    def ack(self, checkpoint_id: int, ack: dict[str, Any]) -> None:
        w = self.who
        body = SubtaskAck(attempt=w.attempt, vertex=w.vertex, subtask_index=w.subtask_index, **ack)
        try:
            self.client.ack(w.job_id, checkpoint_id, body)
        except Conflict as e:
            raise CheckpointDiscarded(str(e)) from e

    def ack_with_state(
        self, checkpoint_id: int, ack: dict[str, Any], operator_state: bytes | None, channel_state: bytes | None
    ) -> None:
        w = self.who
        report = {"attempt": w.attempt, "vertex": w.vertex, "subtask_index": w.subtask_index, **ack}
        try:
            self.client.ack_with_state(
                w.job_id, checkpoint_id, report, operator_state=operator_state, channel_state=channel_state
            )
        except Conflict as e:
            raise CheckpointDiscarded(str(e)) from e

    def decline(self, checkpoint_id: int, reason: str) -> None:
        w = self.who
        try:
            self.client.decline(
                w.job_id, checkpoint_id,
                Decline(attempt=w.attempt, vertex=w.vertex, subtask_index=w.subtask_index, reason=reason[:2000]),
            )
        except (Conflict, NotFound):
            pass  # already aborted or completed: nothing to decline

    def request_checkpoint(self) -> None:
        try:
            self.client.trigger_checkpoint(self.who.job_id)
        except Conflict:
            pass  # one is pending or the pause has not passed: the next request or the scheduler will do

    def report_running(self) -> None:
        w = self.who
        try:
            self.client.report_running(w.job_id, w.attempt, w.vertex, w.subtask_index)
        except Conflict:
            pass  # the attempt or the job already ended: nothing waits for this subtask any more


class Backoff:
    """Capped exponential backoff, and how long the coordinator has been unreachable."""

    def __init__(self, max_outage: float, initial: float = 0.1, cap: float = 2.0, clock=time.monotonic) -> None:
        self.max_outage = max_outage
        self.initial = initial
        self.cap = cap
        self.clock = clock
        self.down_since: float | None = None
        self.delay = initial

    def ok(self) -> None:
        self.down_since = None
        self.delay = self.initial

    def failed(self, what: str, error: BaseException) -> float:
        """Seconds to wait before trying again; raises :class:`CoordinatorLost` past ``max_outage``."""
        now = self.clock()
        if self.down_since is None:
            self.down_since = now
        if now - self.down_since > self.max_outage:
            raise CoordinatorLost(
                f"{what}: the coordinator has been unreachable for {now - self.down_since:.0f}s, longer than the "
                f"{self.max_outage:.0f}s a subtask waits ({type(error).__name__}: {error})"
            ) from error
        delay = self.delay
        self.delay = min(self.cap, self.delay * 2)
        return delay


def patiently(call: Callable[[], T], what: str, max_outage: float, sleep: Callable[[float], None] = time.sleep) -> T:
    """Run one SDK call, waiting with backoff for a coordinator that is down or restarting, up to ``max_outage``
    seconds (then :class:`CoordinatorLost`). A call whose outcome is unknown (sent, then the connection broke)
    is not repeated here: the SDK already repeats what is safe to repeat."""
    backoff = Backoff(max_outage)
    while True:
        try:
            return call()
        except OutcomeUnknown:
            raise
        except TRANSIENT as e:
            sleep(backoff.failed(what, e))


class SdkEvents:
    """The job's event stream through the SDK, from after event id ``after``, as typed payloads.

    It reconnects for as long as the subtask runs, resuming after the last event it saw (so no event is lost or
    seen twice), and raises :class:`CoordinatorLost` when the coordinator stays unreachable past ``max_outage`` and
    :class:`AttemptEnded` when the coordinator refuses the attempt's token.
    """

    def __init__(
        self, client: Any, job_id: int, after: int | None, max_outage: float = DEFAULT_MAX_OUTAGE, sleep=time.sleep
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.last_id = after
        self.backoff = Backoff(max_outage)
        self.sleep = sleep
        self.closed = False

    def __iter__(self) -> Iterator[EventPayload]:
        while not self.closed:
            try:
                for event in self.client.events(self.job_id, after=self.last_id):
                    if self.closed:
                        return
                    self.backoff.ok()
                    self.last_id = event.id
                    yield payload_of(event)
                error: BaseException = EOFError("the stream ended")
            except (Unauthorized, Forbidden) as e:
                if self.closed:
                    return
                raise AttemptEnded(f"the coordinator refuses this attempt's token: {e}") from e
            except TRANSIENT as e:
                error = e
            except Exception as e:  # noqa: BLE001 - closing the client from another thread ends the stream
                if self.closed:
                    return
                error = e
            if self.closed:
                return
            self.sleep(self.backoff.failed(f"the event stream of job {self.job_id}", error))

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
            body["metrics"] = dict(up.metrics, async_duration=int((time.monotonic() - up.handed_over) * 1000))
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
                if up.on_written is not None:
                    up.on_written(written.key, True)
                self.reporter.ack(up.checkpoint_id, body)
        else:
            # async_duration: up to the one request that carries the blobs and the ack (the coordinator's part of
            # making them durable is the ack's own latency)
            body["metrics"] = dict(up.metrics, async_duration=int((time.monotonic() - up.handed_over) * 1000))
            self.reporter.ack_with_state(up.checkpoint_id, body, up.operator_state, up.channel_state or None)
        up.result = body
        self.acked.append(up.checkpoint_id)
        if self.on_done is not None:
            self.on_done(up)

