"""Input gates: the receiving side of a subtask's channels, with exclusive and floating credits.

Each channel starts with ``exclusive`` credits; the gate lends its ``floating`` buffers to channels whose
sender announced a backlog, and takes them back as buffers are processed (Flink's credit-based flow control).
A priority barrier is queued in its channel at its arrival position *and* announced on the gate's priority
list, so the subtask acts on it between two records and knows exactly which buffers it overtook.

An aligned barrier of an ``aligned_then_unaligned`` checkpoint that is still queued behind buffers when its
alignment timeout passes (or that arrives after it) becomes a priority barrier in place: it overtakes the buffers
queued ahead of it, which are persisted, instead of waiting until they are processed (Flink announces such
barriers for the same reason).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque

from spark_plugin.barriers import CheckpointBarrier
from spark_plugin.channel_state import ChannelInfo
from spark_plugin.network import wire
from spark_plugin.network.mailbox import Mailbox

BUFFER = "B"
RECOVERED = "R"  # a buffer of recovered input channel state: processed first, returns no credit
BARRIER = "E"
PRIORITY = "P"
END = "END"


class InputChannel:
    """One channel's receiving side: its queue of buffers and barrier markers, and its credit account."""

    def __init__(self, index: int, info: ChannelInfo) -> None:
        self.index = index
        self.info = info
        self.items: deque[tuple] = deque()
        self.sock: socket.socket | None = None
        self.granted = 0
        self.floating = 0
        self.backlog = 0
        self.blocked = False
        self.ended = False
        self.recording: int | None = None
        self.received_buffers = 0
        self.received_bytes = 0
        self.error: BaseException | None = None


class InputGate:
    """All input channels of a subtask."""

    def __init__(self, infos: list[ChannelInfo], exclusive: int, floating: int, mailbox: Mailbox) -> None:
        self.channels = [InputChannel(i, info) for i, info in enumerate(infos)]
        self.exclusive = exclusive
        self.floating_free = floating
        self.mailbox = mailbox
        self.priority: deque[tuple[int, CheckpointBarrier]] = deque()
        self.next_deadline: int | None = None
        """The earliest alignment deadline (epoch ms) of an aligned barrier queued in a channel, if any."""
        self._next_channel = 0
        self._threads: list[threading.Thread] = []
        self.closed = False

    # ---------------------------------------------------------------- network side

    def attach(self, index: int, sock: socket.socket) -> None:
        """Grant the channel its exclusive credits and start reading it."""
        ch = self.channels[index]
        ch.sock = sock
        with self.mailbox.lock:
            ch.granted = self.exclusive
        wire.send(sock, wire.CREDIT, self.exclusive)
        t = threading.Thread(target=self._read_loop, args=(ch,), name=f"read {ch.info.name}", daemon=True)
        self._threads.append(t)
        t.start()

    def _read_loop(self, ch: InputChannel) -> None:
        sock = ch.sock
        assert sock is not None
        try:
            while True:
                kind, aux, payload = wire.recv(sock)
                with self.mailbox.lock:
                    if kind == wire.BUFFER:
                        ch.items.append((BUFFER, payload))
                        ch.granted -= 1
                        ch.backlog = aux
                        ch.received_buffers += 1
                        ch.received_bytes += len(payload)
                        self._lend_floating()
                    elif kind == wire.EVENT:
                        self._queue_barrier(ch, CheckpointBarrier.from_dict(json.loads(payload)))
                    elif kind == wire.PRIORITY:
                        barrier = CheckpointBarrier.from_dict(json.loads(payload))
                        ch.items.append((PRIORITY, barrier))
                        self.priority.append((ch.index, barrier))
                    elif kind == wire.END:
                        ch.items.append((END,))
                        self.mailbox.signal_locked()
                        return
                    self.mailbox.signal_locked()
        except (OSError, EOFError) as e:
            with self.mailbox.lock:
                if not self.closed:
                    ch.error = e
                self.mailbox.signal_locked()

    def _queue_barrier(self, ch: InputChannel, barrier: CheckpointBarrier) -> None:
        """Queue an aligned barrier; one whose alignment timeout already passed overtakes at once (lock held)."""
        deadline = barrier.deadline
        if deadline is None or barrier.unaligned:
            ch.items.append((BARRIER, barrier))
        elif time.time() * 1000 >= deadline and not ch.blocked:
            unaligned = barrier.as_unaligned()
            ch.items.append((PRIORITY, unaligned))
            self.priority.append((ch.index, unaligned))
        else:
            ch.items.append((BARRIER, barrier))
            self.next_deadline = deadline if self.next_deadline is None else min(self.next_deadline, deadline)

    def convert_due(self, now_ms: int) -> int:
        """Turn queued aligned barriers whose alignment timeout passed into priority barriers, in place (lock
        held); a blocked channel's are left until it is unblocked. Returns how many were converted."""
        converted = 0
        later: int | None = None
        for ch in self.channels:
            for pos, item in enumerate(ch.items):
                if item[0] != BARRIER or item[1].unaligned or item[1].deadline is None:
                    continue
                deadline = item[1].deadline
                if deadline > now_ms:
                    later = deadline if later is None else min(later, deadline)
                elif ch.blocked:
                    later = now_ms + 50 if later is None else min(later, now_ms + 50)  # look again soon
                else:
                    unaligned = item[1].as_unaligned()
                    ch.items[pos] = (PRIORITY, unaligned)
                    self.priority.append((ch.index, unaligned))
                    converted += 1
        self.next_deadline = later
        return converted

    def _grant(self, ch: InputChannel, n: int) -> None:
        ch.granted += n
        if ch.sock is not None and not self.closed:
            try:
                wire.send(ch.sock, wire.CREDIT, n)
            except OSError as e:
                ch.error = e

    def _lend_floating(self) -> None:
        """Lend floating buffers to channels whose backlog exceeds their credit (lock held)."""
        if self.floating_free <= 0:
            return
        for ch in self.channels:
            want = ch.backlog - ch.granted
            if want > 0 and not ch.ended:
                n = min(want, self.floating_free)
                ch.floating += n
                self.floating_free -= n
                self._grant(ch, n)
                if self.floating_free <= 0:
                    return

    # ---------------------------------------------------------------- called by the subtask loop (lock held)

    def release(self, index: int) -> None:
        """A buffer of channel ``index`` was processed: its memory goes back as credit or to the floating pool."""
        ch = self.channels[index]
        if ch.floating > 0 and ch.backlog <= ch.granted:
            ch.floating -= 1
            self.floating_free += 1
            self._lend_floating()
        else:
            self._grant(ch, 1)

    def poll(self, events_only: bool = False) -> tuple[InputChannel, tuple] | None:
        """The next item of the next unblocked channel with data, round robin; None if there is none.

        With ``events_only`` only a barrier or end-of-partition at the head of a channel is returned: what the
        subtask can act on while its outputs have no room for the records of a buffer.
        """
        n = len(self.channels)
        for k in range(n):
            i = (self._next_channel + k) % n
            ch = self.channels[i]
            if ch.blocked or not ch.items or ch.items[0][0] == PRIORITY:
                continue
            if events_only and ch.items[0][0] in (BUFFER, RECOVERED):
                continue
            self._next_channel = (i + 1) % n
            return ch, ch.items.popleft()
        return None

    def take_priority(self) -> tuple[int, CheckpointBarrier, list[bytes]] | None:
        """Remove the oldest priority barrier's marker; return its channel, the barrier and the buffers it overtook.

        The overtaken buffers stay queued (they are still processed); the caller persists them as channel state.
        """
        if not self.priority:
            return None
        index, barrier = self.priority.popleft()
        items = self.channels[index].items
        overtaken: list[bytes] = []
        for pos, item in enumerate(items):
            if item[0] == PRIORITY and item[1] is barrier:
                del items[pos]
                break
            if item[0] == BUFFER or item[0] == RECOVERED:
                overtaken.append(item[1])
        return index, barrier, overtaken

    def prepend_recovered(self, index: int, buffers: list[bytes]) -> None:
        """Queue recovered input channel state ahead of everything the channel will receive."""
        with self.mailbox.lock:
            self.channels[index].items.extendleft((RECOVERED, b) for b in reversed(buffers))
            self.mailbox.signal_locked()

    def failed(self) -> InputChannel | None:
        for ch in self.channels:
            if ch.error is not None:
                return ch
        return None

    def all_ended(self) -> bool:
        return all(ch.ended for ch in self.channels)

    def close(self) -> None:
        with self.mailbox.lock:
            self.closed = True
        for ch in self.channels:
            if ch.sock is not None:
                try:
                    ch.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                ch.sock.close()
