"""The subtask's mailbox: one lock shared by the loop and the network threads, and the loop's wake-up signal."""

from __future__ import annotations

import threading


class Mailbox:
    """A lock plus a condition the subtask loop waits on; every thread with news for the loop signals it."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.pending = False

    def signal(self) -> None:
        with self.lock:
            self.pending = True
            self.cond.notify_all()

    def signal_locked(self) -> None:
        """Signal while already holding the lock."""
        self.pending = True
        self.cond.notify_all()

    def wait(self, timeout: float | None) -> None:
        """Wait (lock held by the caller) until signalled or ``timeout`` seconds pass."""
        if not self.pending:
            self.cond.wait(timeout)
        self.pending = False
