"""The coordinator's events for one subtask: a thread reads the job's event stream and posts each event to the
subtask loop's mailbox; the loop takes them between two records.

Checkpoint events of another attempt are dropped here. When the stream cannot go on (the coordinator stayed
unreachable past the subtask's limit, or it refuses the attempt's token) the feed says why and wakes the loop.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from contract.events import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointTriggered,
    EventPayload,
    SwitchToUnaligned,
)
from spark_plugin.network.mailbox import Mailbox
from spark_plugin.task.coordination import AttemptEnded, CoordinatorEvents

log = logging.getLogger("overtake.subtask")

CHECKPOINT_EVENTS = (CheckpointTriggered, SwitchToUnaligned, CheckpointCompleted, CheckpointAborted)


class EventFeed:
    """The job's events, posted to the subtask's mailbox in the order the coordinator sent them."""

    def __init__(
        self,
        events: CoordinatorEvents | None,
        attempt: int | None,
        mailbox: Mailbox,
        on_trigger: Callable[[CheckpointTriggered], None] | None = None,
        on_ended: Callable[[str], None] | None = None,
    ) -> None:
        self.events = events
        self.on_trigger = on_trigger
        """Called on the feed's thread for each trigger of this attempt (its write target is needed off the loop)."""
        self.on_ended = on_ended
        """Called on the feed's thread when the attempt is over, with why: the subtask may be inside a sink's
        commit, which the loop cannot interrupt."""
        self.attempt = attempt
        self.mailbox = mailbox
        self.queue: deque[EventPayload] = deque()
        self.failure: str | None = None
        """Why the feed stopped with the subtask still needing it (the subtask fails)."""
        self.ended: str | None = None
        """Set when the coordinator no longer accepts the attempt (the job or the attempt ended)."""
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.events is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._read, name="events", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.events is not None
        try:
            for payload in self.events:
                if isinstance(payload, CHECKPOINT_EVENTS) and self._other_attempt(payload.attempt):
                    continue
                if isinstance(payload, CheckpointTriggered) and self.on_trigger is not None:
                    self.on_trigger(payload)
                self.post(payload)
        except AttemptEnded as e:
            self._stop("ended", str(e))
            if self.on_ended is not None:
                try:
                    self.on_ended(str(e))
                except Exception:  # noqa: BLE001 - the loop halts on ``ended`` all the same
                    log.exception("telling the subtask's sinks that the attempt is over failed")
        except Exception as e:  # noqa: BLE001 - the loop fails loudly with the reason
            self._stop("failure", f"the coordinator's event stream failed: {type(e).__name__}: {e}")

    def _other_attempt(self, attempt: int | None) -> bool:
        return attempt is not None and self.attempt is not None and attempt != self.attempt

    def _stop(self, field: str, message: str) -> None:
        log.warning("%s", message)
        with self.mailbox.lock:
            setattr(self, field, message)
            self.mailbox.signal_locked()

    def post(self, payload: EventPayload) -> None:
        """Hand an event to the loop (any thread)."""
        with self.mailbox.lock:
            self.queue.append(payload)
            self.mailbox.signal_locked()

    def take(self) -> list[EventPayload]:
        """The events posted since the last call, oldest first (the loop's thread)."""
        with self.mailbox.lock:
            taken = list(self.queue)
            self.queue.clear()
        return taken

    def close(self) -> None:
        if self.events is not None:
            self.events.close()
