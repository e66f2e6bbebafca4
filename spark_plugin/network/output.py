"""Output channels: a queue of buffers waiting for credit, where a priority barrier overtakes queued buffers."""

from __future__ import annotations

import socket
import threading
from collections import deque
from collections.abc import Callable

from spark_plugin.network import wire
from spark_plugin.network.barrier import CheckpointBarrier
from spark_plugin.network.config import BACKLOG
from spark_plugin.network.mailbox import Mailbox
from spark_plugin.network.output_items import (
    END,
    RECOVERY_END,
    OutBarrier,
    OutBuffer,
    OutEnd,
    OutItem,
    OutPriorityBarrier,
    OutRecoveryEnd,
)
from spark_plugin.plan.topology import ChannelInfo


class OutputChannel:
    """One channel's sending side (Flink's subpartition plus its credit-based reader).

    The subtask loop appends finished buffers and barriers (the named items of ``network/output_items.py``); a
    sender thread sends a buffer only when the receiver granted credit, sends events without credit, and sends
    priority events before everything queued.
    ``is_available`` is False once the queue holds as many buffers as the credit plus a backlog of ``backlog``
    (``NetworkConfig.output_backlog_buffers``, ``BACKLOG`` by default; never more than ``max_buffers``, which alone
    bounds it when ``backlog`` is None): that is backpressure. A buffer queued beyond that would only wait here and be
    persisted by every unaligned checkpoint; a credit arriving wakes the subtask loop to produce the next one.

    A priority barrier is sent by the subtask loop itself (``send_priority``) when the sender thread is not in the
    middle of a message: under backpressure the sender thread sleeps waiting for credit, and waking it would add a
    thread switch to every shuffle the barrier crosses. Both take a message off the queue and write it under one send
    lock, so the wire keeps the queue's order.
    """

    def __init__(
        self,
        index: int,
        info: ChannelInfo,
        max_buffers: int,
        mailbox: Mailbox,
        on_barrier_sent: Callable[[int], None],
        backlog: int | None = BACKLOG,
    ) -> None:
        self.index = index
        self.backlog = backlog
        self.info = info
        self.max_buffers = max_buffers
        self.mailbox = mailbox
        self.cond = threading.Condition(mailbox.lock)
        self.queue: deque[OutItem] = deque()
        self.buffers = 0
        self.credit = 0
        self.sock: socket.socket | None = None
        self.closed = False
        self.error: BaseException | None = None
        self.sent_buffers = 0
        self.finished = False
        self.sent_bytes = 0
        self.buffer_size: int | None = None
        """The buffer size the receiver announced (buffer debloating); None: the configured size."""
        self.on_buffer_size: Callable[[int], None] | None = None
        """Called with an announced size (lock held): the record writer cuts this channel's buffers at it."""
        self._on_barrier_sent = on_barrier_sent
        self._threads: list[threading.Thread] = []
        self._send_lock = threading.Lock()
        """Held while a message is taken off the queue and written: by the sender thread or by ``send_priority``."""
        self._backlog = 0
        """The buffers still queued when the sender thread took the buffer it writes (send lock held): the
        ``BUFFER`` message's backlog."""

    # ---------------------------------------------------------------- called by the subtask loop (lock held)

    def is_available(self) -> bool:
        """Whether the loop may produce another buffer for this channel: fewer queued than credit + backlog."""
        if self.backlog is None:
            return self.buffers < self.max_buffers
        return self.buffers < min(self.max_buffers, self.credit + self.backlog)

    def can_send(self) -> bool:
        """Whether one more buffer would be sent at once: a partly filled buffer is flushed only then."""
        return self.credit > self.buffers

    def add_buffer(self, data: bytes, records: int) -> None:
        self.queue.append(OutBuffer(data, records))
        self.buffers += 1
        self.cond.notify_all()

    def add_barrier(self, barrier: CheckpointBarrier) -> None:
        """Queue an aligned barrier behind the buffers already queued."""
        self.queue.append(OutBarrier(barrier))
        self.cond.notify_all()

    def add_priority_barrier(self, barrier: CheckpointBarrier) -> list[OutBuffer]:
        """Put the barrier at the head of the queue; return the buffers it overtook, in order. The caller sends it
        with ``send_priority`` once it released the lock."""
        overtaken = [item for item in self.queue if type(item) is OutBuffer]
        self._insert_priority(barrier)
        return overtaken

    def _insert_priority(self, barrier: CheckpointBarrier) -> None:
        """Insert behind the priority events already at the head, so priority events keep their order. The sender
        thread is not woken: the loop sends it with ``send_priority`` (or, when the sender thread is busy writing,
        the sender thread takes it next)."""
        pos = 0
        while pos < len(self.queue) and type(self.queue[pos]) is OutPriorityBarrier:
            pos += 1
        self.queue.insert(pos, OutPriorityBarrier(barrier))
        if self.sock is None:
            self.cond.notify_all()

    def convert_barrier(self, checkpoint_id: int) -> list[OutBuffer] | None:
        """Turn a queued aligned barrier into a priority one; return the buffers it overtook (None: not queued).
        The caller sends it with ``send_priority`` once it released the lock."""
        overtaken: list[OutBuffer] = []
        for pos, item in enumerate(self.queue):
            if type(item) is OutBarrier and item.barrier.checkpoint_id == checkpoint_id:
                del self.queue[pos]
                self._insert_priority(item.barrier.as_unaligned())
                return overtaken
            if type(item) is OutBuffer:
                overtaken.append(item)
        return None

    def queued_bytes(self) -> int:
        """The bytes of the buffers queued: what a priority barrier would overtake now."""
        return sum(len(item.data) for item in self.queue if type(item) is OutBuffer)

    def queued_barriers(self) -> list[CheckpointBarrier]:
        return [item.barrier for item in self.queue if type(item) is OutBarrier]

    def end_recovery(self) -> None:
        """Everything queued so far is restored output channel state: mark its end (an event, needs no credit)."""
        self.queue.append(RECOVERY_END)
        self.cond.notify_all()

    def end(self) -> None:
        self.queue.append(END)
        self.cond.notify_all()

    def drained(self) -> bool:
        return not self.queue

    # ---------------------------------------------------------------- network side

    def attach(self, sock: socket.socket) -> None:
        """Start sending on the connection the receiver opened."""
        self.sock = sock
        for target, name in ((self._send_loop, "send"), (self._credit_loop, "credit")):
            t = threading.Thread(target=target, name=f"{name} {self.info.name}", daemon=True)
            self._threads.append(t)
            t.start()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        if self.sock is not None:
            wire.close(self.sock)

    def send_priority(self) -> None:
        """Send the priority events at the head of the queue now, from the calling thread (the subtask loop, with
        the mailbox lock not held). When the sender thread is writing a message, it sends them next instead."""
        sock = self.sock
        if sock is None:
            return  # not connected yet: the sender thread starts with whatever is queued
        if not self._send_lock.acquire(blocking=False):
            with self.cond:
                self.cond.notify_all()
            return
        try:
            while True:
                with self.cond:
                    if self.closed or not self.queue or type(self.queue[0]) is not OutPriorityBarrier:
                        return
                    item = self.queue.popleft()
                self._write(sock, item)
        except OSError as e:
            self._fail(e)
        finally:
            self._send_lock.release()

    def _sendable(self) -> bool:
        """Whether the head of the queue may go out now (lock held)."""
        return bool(self.queue) and (type(self.queue[0]) is not OutBuffer or self.credit > 0)

    def _wait_sendable(self) -> bool:
        """Wait until the head of the queue may go out; False once the channel is closed."""
        with self.cond:
            while not self.closed:
                if self._sendable():
                    return True
                self.cond.wait()
            return False

    def _pop(self) -> OutItem | None:
        """Take the head of the queue if it may go out (send lock held); a buffer uses one credit, and the buffers
        still queued are its backlog. The test is ``_sendable``'s, written out: this runs once per message."""
        with self.cond:
            if self.closed or not self.queue:
                return None
            if type(self.queue[0]) is not OutBuffer:
                return self.queue.popleft()
            if self.credit <= 0:
                return None
            item = self.queue.popleft()
            self.credit -= 1
            self.buffers -= 1
            self._backlog = self.buffers
            self.mailbox.signal_locked()  # space freed: the loop may produce again
            return item

    def _write(self, sock: socket.socket, item: OutItem) -> None:
        """Write one message taken off the queue (send lock held)."""
        if type(item) is OutBuffer:
            wire.send(sock, wire.BUFFER, self._backlog, item.data)
            self.sent_buffers += 1
            self.sent_bytes += len(item.data)
        elif type(item) is OutEnd:
            wire.send(sock, wire.END)
            self.finished = True
        elif type(item) is OutRecoveryEnd:
            wire.send(sock, wire.RECOVERY_END)
        else:
            barrier = item.barrier
            wire.send(sock, wire.PRIORITY if type(item) is OutPriorityBarrier else wire.EVENT, 0, barrier.encode())
            with self.cond:
                self._on_barrier_sent(barrier.checkpoint_id)
                self.mailbox.signal_locked()

    def _send_loop(self) -> None:
        sock = self.sock
        assert sock is not None
        try:
            while not self.finished and self._wait_sendable():
                with self._send_lock:
                    item = self._pop()
                    if item is not None:
                        self._write(sock, item)
        except OSError as e:
            self._fail(e)

    def _credit_loop(self) -> None:
        sock = self.sock
        assert sock is not None
        try:
            while True:
                kind, aux, _ = wire.recv(sock)
                if kind == wire.CREDIT:
                    with self.cond:
                        self.credit += aux
                        self.cond.notify_all()
                        self.mailbox.signal_locked()  # room for another buffer: the loop may produce again
                elif kind == wire.BUFFER_SIZE:
                    with self.cond:
                        self.buffer_size = aux
                        if self.on_buffer_size is not None:
                            self.on_buffer_size(aux)
        except (OSError, EOFError) as e:
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        with self.cond:
            if not self.closed and not self.finished:
                self.error = e
                self.closed = True
            self.cond.notify_all()
            self.mailbox.signal_locked()
