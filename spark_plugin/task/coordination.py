"""The subtask's boundary to the coordinator: the reporter of acks and declines, the event feed, and how long a
subtask waits for a coordinator that is down (``Backoff``, ``patiently``).

Subtasks only see :class:`CheckpointReporter` and :class:`CoordinatorEvents`; :class:`SdkReporter` and
:class:`SdkEvents` implement them with the SDK (``client.sync.OvertakeClient``, authenticated with the attempt's task
token), and tests use in-memory fakes. The ack worker (``spark_plugin.task.ack_worker``) sends acks and declines off
the subtask loop, in order.

A coordinator may be down for a while (a crash, a restart, a failover): the event feed reconnects and resumes after
the last event it saw, and the ack worker retries what failed, both with capped backoff, until the request succeeds,
the coordinator refuses it for good, or its checkpoint is aborted. An outage longer than ``max_outage`` seconds
fails the subtask (so the supervisor restarts the pipeline) instead of waiting forever.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import httpx

from client.errors import (
    Conflict,
    CoordinatorUnreachable,
    Forbidden,
    NotFound,
    OutcomeUnknown,
    Unauthorized,
    Unavailable,
)
from contract.events import EventPayload, payload_of
from contract.models import Decline, SubtaskAck

log = logging.getLogger("overtake.subtask")

TRANSIENT = (CoordinatorUnreachable, Unavailable, httpx.TransportError)
"""Errors of a coordinator (or a blob store) that is down or overloaded: the request is sent again."""

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
