"""Input gates: the receiving side of a subtask's channels, with exclusive and floating credits.

Each channel starts with ``exclusive`` credits; the gate lends its ``floating`` buffers only to a channel whose
sender announced a backlog (the buffers it holds beyond its credit, sent with every buffer) and takes them back as
buffers are processed (Flink's credit-based flow control with backlog-driven floating buffers). A sender holds at
most its credit plus one buffer of backlog, so under backpressure a channel's in-flight data is its receiver's
buffers plus one, not a full output queue as well.

With buffer debloating (``spark_plugin.network.debloat``) the gate also measures what its subtask takes in and
announces the buffer size its senders should cut at.

A priority barrier is queued in its channel at its arrival position *and* announced on the gate's priority
list, so the subtask acts on it between two records; the buffers queued ahead of it are the ones it overtook.

An aligned barrier of an ``aligned_then_unaligned`` checkpoint that is still queued behind buffers when its
alignment timeout passes (or that arrives after it) becomes a priority barrier in place: it overtakes the buffers
queued ahead of it, which are persisted, instead of waiting until they are processed (Flink announces such
barriers for the same reason).

A last-barrier checkpoint (``unaligned_last_barrier``) blocks a channel at the moment its priority barrier is acted
on, before its last barrier (:meth:`InputGate.block_at_priority`): the marker stays where it arrived as a *held*
marker, so at the snapshot the channel can still tell which queued buffers the barrier overtook; the buffers are
persisted then and processed after the snapshot, and the marker is dropped when the channel is unblocked.

A checkpoint over its in-flight budget is *held* (:meth:`InputGate.hold`): its barriers no longer overtake. A
priority marker already queued becomes an aligned barrier at its arrival position, its announcement is dropped,
and later ones queue in band, so the subtask processes the buffers a barrier overtook and blocks the channel when it
reaches the marker (what follows the marker on the wire is the upstream's persisted output state or data after the
cut either way).

Each channel persists its own in-flight buffers for a checkpoint through its :class:`ChannelStatePersister`: the
gate hands every buffer it gives the subtask to the channel's persister.

**Recovery order.** A gate restored from a checkpoint hands out its data in three phases, so that nothing sent
after the restore is processed before anything that was in flight at the checkpoint, whatever the parallelism
was then: first the recovered input channel state of every channel (queued ahead of everything), then what the
upstream subtasks re-send of their recovered output channel state (each channel until its ``RECOVERY_END``
marker; a channel that delivered its marker waits for the others), and only then new data.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from contract.models import RestoreSegment
from spark_plugin.network import wire
from spark_plugin.network.barrier import CheckpointBarrier
from spark_plugin.network.channel_items import (
    DATA,
    END,
    RECOVERY_END,
    Barrier,
    Buffer,
    HeldBarrier,
    PriorityBarrier,
    QueueItem,
    RecoveredBuffer,
    RecoveryEnd,
)
from spark_plugin.network.debloat import BufferDebloater
from spark_plugin.network.input_channel import InputChannel
from spark_plugin.network.mailbox import Mailbox
from spark_plugin.network.persisting import ChannelStateWriting
from spark_plugin.network.recovered import FetchBlob, Recovered, route_input
from spark_plugin.plan.topology import ChannelInfo


class InputGate:
    """All input channels of a subtask."""

    def __init__(
        self,
        infos: list[ChannelInfo],
        exclusive: int,
        floating: int,
        mailbox: Mailbox,
        writer: ChannelStateWriting | None = None,
        debloater: BufferDebloater | None = None,
    ) -> None:
        self.channels = [InputChannel(i, info, writer) for i, info in enumerate(infos)]
        self.debloater = debloater if infos else None
        """Sizes the senders' buffers to a target time of throughput (None: debloating is off)."""
        self.exclusive = exclusive
        self.floating_free = floating
        self.mailbox = mailbox
        self.priority: deque[tuple[int, CheckpointBarrier]] = deque()
        self.held: set[int] = set()
        """Checkpoints whose barriers stay at their arrival positions (over their in-flight budget)."""
        self.next_deadline: int | None = None
        """The earliest alignment deadline (epoch ms) of an aligned barrier queued in a channel, if any."""
        self._next_channel = 0
        self._threads: list[threading.Thread] = []
        self.closed = False
        self.recovering = False
        """Restored from a checkpoint and still handing out recovered data (see the module's recovery order)."""

    # ---------------------------------------------------------------- network side

    def attach(self, index: int, sock: socket.socket) -> None:
        """Grant the channel its exclusive credits and start reading it."""
        ch = self.channels[index]
        ch.sock = sock
        with self.mailbox.lock:
            ch.granted = self.exclusive
            size = self.debloater.announced if self.debloater is not None else None
        wire.send(sock, wire.CREDIT, self.exclusive)
        if size is not None and size != self.debloater.max_size:  # type: ignore[union-attr]
            wire.send(sock, wire.BUFFER_SIZE, size)
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
                        ch.items.append(Buffer(payload))
                        ch.granted -= 1
                        ch.backlog = aux
                        ch.received_buffers += 1
                        ch.received_bytes += len(payload)
                        self._lend_floating(ch)
                    elif kind == wire.EVENT:
                        self._queue_barrier(ch, CheckpointBarrier.decode(payload))
                    elif kind == wire.PRIORITY:
                        self._queue_priority(ch, CheckpointBarrier.decode(payload))
                    elif kind == wire.RECOVERY_END:
                        ch.items.append(RECOVERY_END)
                    elif kind == wire.END:
                        ch.items.append(END)
                        self.mailbox.signal_locked()
                        return
                    self.mailbox.signal_locked()
        except (OSError, EOFError) as e:
            with self.mailbox.lock:
                if not self.closed:
                    ch.error = e
                self.mailbox.signal_locked()

    def _queue_priority(self, ch: InputChannel, barrier: CheckpointBarrier) -> None:
        if barrier.checkpoint_id in self.held:
            ch.items.append(Barrier(barrier.as_aligned()))
            return
        ch.items.append(PriorityBarrier(barrier))
        self.priority.append((ch.index, barrier))

    def _queue_barrier(self, ch: InputChannel, barrier: CheckpointBarrier) -> None:
        """Queue an aligned barrier; one whose alignment timeout already passed overtakes at once (lock held)."""
        deadline = barrier.deadline
        if deadline is None or barrier.unaligned:
            ch.items.append(Barrier(barrier))
        elif time.time() * 1000 >= deadline and not ch.blocked:
            self._queue_priority(ch, barrier.as_unaligned())
        else:
            ch.items.append(Barrier(barrier))
            self.next_deadline = deadline if self.next_deadline is None else min(self.next_deadline, deadline)

    def convert_due(self, now_ms: int) -> int:
        """Turn queued aligned barriers whose alignment timeout passed into priority barriers, in place (lock
        held); a blocked channel's are left until it is unblocked. Returns how many were converted."""
        converted = 0
        later: int | None = None
        for ch in self.channels:
            for pos, item in enumerate(ch.items):
                if type(item) is not Barrier:
                    continue
                barrier = item.barrier
                if barrier.unaligned or barrier.deadline is None or barrier.checkpoint_id in self.held:
                    continue
                deadline = barrier.deadline
                if deadline > now_ms:
                    later = deadline if later is None else min(later, deadline)
                elif ch.blocked:
                    later = now_ms + 50 if later is None else min(later, now_ms + 50)  # look again soon
                else:
                    unaligned = barrier.as_unaligned()
                    ch.items[pos] = PriorityBarrier(unaligned)
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

    def _lend_floating(self, ch: InputChannel) -> None:
        """The sender of ``ch`` announced its backlog: lend it floating buffers for the part its credit does not
        cover (lock held)."""
        want = ch.backlog - ch.granted
        if want > 0 and self.floating_free > 0 and not ch.ended:
            n = min(want, self.floating_free)
            ch.floating += n
            self.floating_free -= n
            self._grant(ch, n)

    def _lend_returned(self) -> None:
        """A floating buffer came back: it goes to a channel whose announced backlog is still not covered (lock
        held)."""
        for ch in self.channels:
            if self.floating_free <= 0:
                return
            self._lend_floating(ch)

    # ---------------------------------------------------------------- called by the subtask loop (lock held)

    def release(self, index: int) -> None:
        """A buffer of channel ``index`` was processed: its memory goes back as credit or to the floating pool."""
        ch = self.channels[index]
        if ch.floating > 0 and ch.backlog <= ch.granted:
            ch.floating -= 1
            self.floating_free += 1
            self._lend_returned()
        else:
            self._grant(ch, 1)

    def start_recovery(self) -> None:
        """The subtask was restored from a checkpoint: hand out recovered data first (the recovery order)."""
        self.recovering = bool(self.channels)

    def _recovery_phase(self) -> str | None:
        """``"input"`` while recovered input state is queued, ``"output"`` while some channel has not delivered its
        ``RECOVERY_END``, None once recovery is over (lock held)."""
        if not self.recovering:
            return None
        if any(ch.items and type(ch.items[0]) is RecoveredBuffer for ch in self.channels):
            return "input"
        for ch in self.channels:
            if not ch.recovery_ended and ch.items and type(ch.items[0]) is RecoveryEnd:
                ch.items.popleft()
                ch.recovery_ended = True
        if all(ch.recovery_ended for ch in self.channels):
            self.recovering = False
            return None
        return "output"

    def poll(self, events_only: bool = False) -> tuple[InputChannel, QueueItem] | None:
        """The next item of the next unblocked channel with data, round robin; None if there is none.

        A buffer handed out goes through its channel's persister first. With ``events_only`` only a barrier or
        end-of-partition at the head of a channel is returned: what the subtask can act on while its outputs have
        no room for the records of a buffer. While the gate recovers, only recovered data is handed out.
        """
        phase = self._recovery_phase()
        n = len(self.channels)
        for k in range(n):
            i = (self._next_channel + k) % n
            ch = self.channels[i]
            while not ch.blocked and ch.items and type(ch.items[0]) is HeldBarrier:
                ch.items.popleft()  # its checkpoint was taken: the buffers it overtook were persisted and come next
            if ch.blocked or not ch.items or type(ch.items[0]) is PriorityBarrier:
                continue
            if (phase == "input" and type(ch.items[0]) is not RecoveredBuffer) or (phase == "output" and ch.recovery_ended):
                continue
            if events_only and type(ch.items[0]) in DATA:
                continue
            self._next_channel = (i + 1) % n
            item = ch.items.popleft()
            if type(item) in DATA:
                ch.persister.maybe_persist(item.data)
                if self.debloater is not None:
                    self.debloater.add_bytes(len(item.data))
            return ch, item
        return None

    def next_priority(self) -> tuple[int, CheckpointBarrier] | None:
        """The oldest announced priority barrier and its channel; its marker stays queued until ``priority_done``,
        so the channel can still tell which buffers it overtook."""
        return self.priority[0] if self.priority else None

    def priority_done(self, index: int, barrier: CheckpointBarrier) -> None:
        """The subtask acted on the priority barrier: drop its announcement and its marker (the overtaken buffers
        stay queued and are processed as usual)."""
        for pos, (i, b) in enumerate(self.priority):
            if i == index and b is barrier:
                del self.priority[pos]
                break
        items = self.channels[index].items
        for pos, item in enumerate(items):
            if type(item) is PriorityBarrier and item.barrier is barrier:
                del items[pos]
                return

    def block_at_priority(self, index: int, checkpoint_id: int) -> None:
        """Block channel ``index`` at once, before the buffers its queued priority barrier of ``checkpoint_id``
        overtook: the marker becomes a held one at its arrival position, so ``buffers_before`` still finds them
        (lock held)."""
        ch = self.channels[index]
        ch.blocked = True
        for pos, item in enumerate(ch.items):
            if type(item) is PriorityBarrier and item.barrier.checkpoint_id == checkpoint_id:
                ch.items[pos] = HeldBarrier(item.barrier)
                return

    def hold(self, checkpoint_id: int) -> None:
        """The checkpoint is over its in-flight budget: its barriers no longer overtake (lock held). Queued priority
        markers become aligned barriers where they are, their announcements are dropped, later ones queue in band."""
        self.held = {cid for cid in self.held if cid > checkpoint_id} | {checkpoint_id}
        for ch in self.channels:
            for pos, item in enumerate(ch.items):
                if type(item) is PriorityBarrier and item.barrier.checkpoint_id == checkpoint_id:
                    ch.items[pos] = Barrier(item.barrier.as_aligned())
        keep = [(i, b) for i, b in self.priority if b.checkpoint_id != checkpoint_id]
        self.priority.clear()  # in place: the subtask loop holds on to this deque
        self.priority.extend(keep)

    # ---------------------------------------------------------------- channel state (persisting: lock held)

    def live_channels(self) -> set[int]:
        """The channels that have not ended: the ones a checkpoint's barrier still has to come on."""
        return {ch.index for ch in self.channels if not ch.ended}

    def start_persisting(self, index: int, checkpoint_id: int, in_hand: bytes | None) -> None:
        """Persist channel ``index``'s in-flight data for the checkpoint until its barrier arrives there;
        ``in_hand`` is the unread rest of the channel's buffer the subtask holds (the barrier overtook it)."""
        self.channels[index].persister.start(checkpoint_id, in_hand)

    def stop_persisting(self, index: int, checkpoint_id: int) -> None:
        """The checkpoint's barrier arrived on channel ``index``: persist the buffers it overtook in the queue, then
        stop."""
        ch = self.channels[index]
        ch.persister.stop(checkpoint_id, ch.buffers_before(checkpoint_id))

    def abort_persisting(self, checkpoint_id: int) -> None:
        """The checkpoint was dropped: no channel persists for it any more."""
        for ch in self.channels:
            ch.persister.abort(checkpoint_id)

    def inflight_bytes(self, channels: set[int], checkpoint_id: int) -> int:
        """The bytes queued in ``channels`` ahead of the checkpoint's barrier: what an unaligned checkpoint would
        persist of them now (lock held)."""
        return sum(self.channels[i].bytes_before(checkpoint_id) for i in channels)

    def restore(
        self,
        segments: list[RestoreSegment],
        fetch: FetchBlob,
        key_fns: dict[str, Callable[[Any], Any]],
        max_parallelism: int,
        own: tuple[int, int],
    ) -> Recovered:
        """Queue the recovered input channel state ahead of everything the channels will receive (before the loop).

        A segment goes to its own channel, or after a rescale to a channel from the same upstream vertex; records
        of a hash edge (``key_fns``: its key selector by upstream vertex) stay only where their key group is in
        ``own``."""
        recovered, done = route_input(
            segments, fetch, [ch.info for ch in self.channels], key_fns, max_parallelism, own
        )
        for channel, buffers in recovered.items():
            self.prepend_recovered(channel, buffers)
        return done

    def prepend_recovered(self, index: int, buffers: list[bytes]) -> None:
        """Queue recovered input channel state ahead of everything the channel will receive."""
        with self.mailbox.lock:
            self.channels[index].items.extendleft(RecoveredBuffer(b) for b in reversed(buffers))
            self.mailbox.signal_locked()

    def buffers_in_use(self, in_hand: bool) -> int:
        """Buffers of the gate holding data now: queued, announced by the senders as backlog, and the one in the
        subtask's hand (lock held)."""
        n = int(in_hand)
        for ch in self.channels:
            n += ch.backlog + sum(1 for item in ch.items if type(item) is Buffer)
        return n

    def debloat(self, now: float, in_hand: bool) -> int | None:
        """Every debloating period (called from the subtask loop): recompute the buffer size and announce it to
        every sender when it changed enough; returns the size announced, if any."""
        debloater = self.debloater
        if debloater is None or not debloater.due(now):
            return None
        with self.mailbox.lock:
            size = debloater.recalculate(now, self.buffers_in_use(in_hand))
            if size is None:
                return None
            for ch in self.channels:
                if ch.sock is not None and not ch.ended and not self.closed:
                    try:
                        wire.send(ch.sock, wire.BUFFER_SIZE, size)
                    except OSError as e:
                        ch.error = e
        return size

    def block(self, index: int) -> None:
        self.channels[index].blocked = True

    def unblock_all(self) -> None:
        for ch in self.channels:
            ch.blocked = False

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
                wire.close(ch.sock)
