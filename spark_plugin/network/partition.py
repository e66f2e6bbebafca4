"""A subtask's output side (Flink's result partition): its output channels, one record writer per output edge, and
barriers sent on every channel, with the buffers a priority barrier overtakes handed to the channel-state writer.

This is the one place that feeds the output side of channel state: the overtaken buffers when a barrier is sent
with priority or converted to one, and the end of the output side (as a priority barrier is put at the head of every
channel, or once every channel has sent an aligned one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contract.models import Partitioning, RestoreSegment
from spark_plugin.network.barrier import CheckpointBarrier
from spark_plugin.network.config import NetworkConfig
from spark_plugin.network.elements import is_marker, strip_markers
from spark_plugin.network.framing import count_records, decode_records
from spark_plugin.network.mailbox import Mailbox
from spark_plugin.network.output import OutputChannel
from spark_plugin.network.persisting import ChannelStateWriting
from spark_plugin.network.record_writer import RecordWriter, fan_out
from spark_plugin.network.recovered import FetchBlob, Recovered, RestoreMismatch, segment_buffers
from spark_plugin.plan.topology import OutputEdgeSpec


class OutputPartition:
    """Every output channel of a subtask; ``emit`` is what the last operator of its chain writes records to."""

    def __init__(
        self,
        edges: list[OutputEdgeSpec],
        key_fns: list[Callable[[Any], Any] | None],
        network: NetworkConfig,
        mailbox: Mailbox,
        writer: ChannelStateWriting,
        start: int = 0,
    ) -> None:
        self.mailbox = mailbox
        self.lock = mailbox.lock
        self.writer = writer
        self.channels: list[OutputChannel] = []
        self.writers: list[RecordWriter] = []
        self.by_key: dict[str, OutputChannel] = {}
        self.ended = False
        self._barriers_in_queue: dict[int, int] = {}
        self.regenerated: RecordWriter | None = None
        """The writer of the edge whose records this subtask regenerates on recovery (``JobEdge.regenerated``)."""
        for edge, key_fn in zip(edges, key_fns, strict=True):
            channels = []
            for info, key in zip(edge.channels, edge.keys, strict=True):
                ch = OutputChannel(
                    len(self.channels), info, network.max_buffers_per_output_channel, mailbox, self._barrier_sent,
                    network.output_backlog_buffers,
                )
                self.channels.append(ch)
                self.by_key[key] = ch
                channels.append(ch)
            writer = RecordWriter(
                channels, edge.edge.partitioning, key_fn, edge.target_max_parallelism, network.buffer_size,
                mailbox, start=start,
            )
            if getattr(edge.edge, "regenerated", False):
                writer.track_outputs()  # before ``emit`` below takes the writer's emit function
                self.regenerated = writer
            self.writers.append(writer)
        # a side output's edge (late records of a window) gets only what its operator sends to that side
        sides = [getattr(edge.edge, "side", None) for edge in edges]
        self.emit = fan_out([w for w, side in zip(self.writers, sides, strict=True) if side is None])
        self.side_emits = {
            tag: fan_out([w for w, side in zip(self.writers, sides, strict=True) if side == tag])
            for tag in set(sides) - {None}
        }

    # ---------------------------------------------------------------- records

    def available(self) -> bool:
        """Whether every channel may take another buffer: fewer queued than its credit plus the backlog (False:
        backpressure)."""
        for ch in self.channels:
            if not ch.is_available():
                return False
        return True

    def flush(self) -> None:
        """Send every partly filled buffer (before a barrier and at the end)."""
        for w in self.writers:
            w.flush_all()

    def flush_sendable(self) -> None:
        """Send the partly filled buffers that their channels would send at once (on the flush interval, when
        idle); the others keep filling until a credit comes."""
        for w in self.writers:
            w.flush_sendable()

    def broadcast_element(self, element: Any) -> None:
        """Send a watermark or status marker on every channel of every edge, in band behind the records so far."""
        if self.ended:
            return
        for w in self.writers:
            w.broadcast(element)

    @property
    def bytes_out(self) -> int:
        return sum(w.bytes_out for w in self.writers)

    # ---------------------------------------------------------------- barriers

    def overtakable_bytes(self) -> int:
        """The bytes a priority barrier sent now would overtake and persist: every queued buffer and every partly
        filled one (lock held)."""
        partial = sum(b.size for w in self.writers for b in w.builders)
        return partial + sum(ch.queued_bytes() for ch in self.channels)

    def broadcast_barrier(self, barrier: CheckpointBarrier, priority: bool, persist: bool = True) -> None:
        """Send the barrier on every channel: at the head of each queue (``priority``; what it overtook is persisted
        for its checkpoint, unless ``persist`` is False: a regenerating subtask's last-barrier checkpoint logged the
        inputs of those buffers instead) or behind the queued buffers.

        A priority barrier's output side of the checkpoint's channel state ends at once: what it overtook is
        recorded as it is put at the head, and nothing queued later belongs to the checkpoint; the loop then sends it
        itself. An aligned barrier's output side ends once every channel has sent it (it may still be turned into a
        priority barrier while queued). At once, too, when there is no channel or the output has ended."""
        self.flush()
        cid = barrier.checkpoint_id
        with self.lock:
            if not self.channels or self.ended:
                self.writer.finish_output(cid)
                return
            if priority:
                for ch in self.channels:
                    overtaken = ch.add_priority_barrier(barrier)
                    if persist:
                        for buffer in overtaken:
                            self.writer.add_output_data(cid, ch.info, buffer.data, buffer.records)
                self.writer.finish_output(cid)
            else:
                self._barriers_in_queue[cid] = len(self.channels)
                for ch in self.channels:
                    ch.add_barrier(barrier)
        if priority:
            self.send_priority()

    def send_priority(self) -> None:
        """Send the priority events queued at the heads of the channels from this thread (lock not held)."""
        for ch in self.channels:
            ch.send_priority()

    def convert_barrier(self, checkpoint_id: int) -> bool:
        """Turn the checkpoint's aligned barriers still queued into priority barriers, persisting what they overtake;
        True when any was still queued."""
        converted = False
        with self.lock:
            for ch in self.channels:
                overtaken = ch.convert_barrier(checkpoint_id)
                if overtaken is None:
                    continue
                converted = True
                for buffer in overtaken:
                    self.writer.add_output_data(checkpoint_id, ch.info, buffer.data, buffer.records)
        if converted:
            self.send_priority()
        return converted

    def barriers_queued(self, checkpoint_id: int) -> bool:
        """Whether a barrier of the checkpoint still waits in an output queue."""
        return self._barriers_in_queue.get(checkpoint_id, 0) > 0

    def _barrier_sent(self, checkpoint_id: int) -> None:
        """A sender thread sent a barrier (lock held)."""
        left = self._barriers_in_queue.get(checkpoint_id)
        if left is None:
            return
        if left <= 1:
            del self._barriers_in_queue[checkpoint_id]
            self.writer.finish_output(checkpoint_id)
        else:
            self._barriers_in_queue[checkpoint_id] = left - 1

    def forget(self, checkpoint_id: int) -> None:
        """The checkpoint was aborted: stop waiting for its barriers."""
        with self.lock:
            self._barriers_in_queue.pop(checkpoint_id, None)

    # ---------------------------------------------------------------- restore

    def restore(self, segments: list[RestoreSegment], fetch: FetchBlob) -> Recovered:
        """Queue the recovered output channel state in front of the output queues (re-sent before any new output;
        before the loop), then ``end_recovery``.

        Without rescaling each segment's buffers go back to their channel as they were. After a rescale, records of
        a hash edge are partitioned again for the new downstream parallelism, forward and rebalance buffers are
        spread whole over the channels of their edge, and broadcast state stays per receiver."""
        by_name = {ch.info.name: ch for ch in self.channels}
        writer_of = {ch.info.name: w for w in self.writers for ch in w.channels}
        done = Recovered()
        spread: dict[str, int] = {}
        for seg in segments:
            buffers = segment_buffers(fetch, seg)
            done.count(buffers)
            ch = by_name.get(seg.channel)
            writer = writer_of.get(seg.channel) or next(
                (w for w in self.writers if w.channels and w.channels[0].info.peer_vertex == seg.peer_vertex), None
            )
            if writer is None:
                raise RestoreMismatch(
                    f"the checkpoint has output for {seg.peer_vertex!r} ({seg.channel!r}), which this pipeline "
                    f"does not feed"
                )
            if seg.partitioning == Partitioning.hash and not _partitioned_for(writer, ch, buffers):
                done.rerouted_records += _partition_again(writer, buffers)
                continue
            if ch is None and seg.partitioning == Partitioning.broadcast:
                ch = next((c for c in writer.channels if c.info.peer_subtask == seg.peer_subtask), None)
                if ch is None:
                    continue  # a downstream subtask that no longer exists (it got every record on its own channel too)
            if ch is None:  # forward/rebalance buffers of a rescaled edge: whole buffers go round robin
                n = len(writer.channels)
                k = spread.get(seg.peer_vertex or "", seg.from_subtask)
                with self.lock:
                    for b in buffers:
                        b = strip_markers(b)  # on another channel its watermarks would be out of place
                        writer.channels[k % n].add_buffer(b, count_records(b))
                        k += 1
                spread[seg.peer_vertex or ""] = k
                continue
            with self.lock:
                for b in buffers:
                    ch.add_buffer(b, count_records(b))
        return done

    def end_recovery(self) -> None:
        """The restored output channel state is queued: mark its end on every channel (a restored downstream
        subtask takes no new data before every upstream channel delivered this marker)."""
        with self.lock:
            for ch in self.channels:
                ch.end_recovery()

    # ---------------------------------------------------------------- end, failure, close

    def end(self) -> None:
        """No more records: flush and queue the end of partition on every channel."""
        if self.ended:
            return
        self.flush()
        with self.lock:
            for ch in self.channels:
                ch.end()
            self.ended = True

    def drained(self) -> bool:
        """Every channel sent its end of partition (or is closed)."""
        with self.lock:
            return all(ch.finished or ch.closed for ch in self.channels)

    def failed(self) -> OutputChannel | None:
        for ch in self.channels:
            if ch.error is not None:
                return ch
        return None

    def close(self) -> None:
        for ch in self.channels:
            ch.close()


def _partitioned_for(writer: RecordWriter, ch: OutputChannel | None, buffers: list[bytes]) -> bool:
    """Whether a hash edge's recovered buffers belong to ``ch`` as they are (same downstream parallelism)."""
    if ch is None:
        return False
    position = writer.channels.index(ch)
    return all(writer.channel_of(r) == position for b in buffers for r in decode_records(b) if not is_marker(r))


def _partition_again(writer: RecordWriter, buffers: list[bytes]) -> int:
    """Write a hash edge's recovered records through its writer again (partitioned for another parallelism);
    returns how many. Watermarks are dropped: the subtask sends its restored watermark behind these records."""
    n = 0
    for b in buffers:
        records = [r for r in decode_records(b) if not is_marker(r)]
        for r in records:
            writer.emit(r)
        n += len(records)
    writer.flush_all()
    return n
