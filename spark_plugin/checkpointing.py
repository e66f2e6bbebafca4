"""The subtask's side of a checkpoint: the barrier states' actions, pending checkpoints and their hand-over.

:class:`CheckpointActions` is mixed into :class:`~spark_plugin.subtask.Subtask` and implements
:class:`~spark_plugin.barriers.BarrierActions` on its gate, outputs and operators: snapshot operator state,
forward barriers (recording overtaken output buffers), record input channels, and hand finished checkpoints to
the :class:`~spark_plugin.coordination.AckWorker`.
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass

from spark_plugin.barriers import CheckpointBarrier
from spark_plugin.channel_state import ChannelStateWriter
from spark_plugin.coordination import CheckpointUpload


@dataclass
class PendingCheckpoint:
    """A checkpoint this subtask snapshotted and whose channel state is still being collected."""

    barrier: CheckpointBarrier
    writer: ChannelStateWriter
    operator_state: bytes | None
    source_offsets: dict | None
    unaligned: bool
    first_barrier_ms: int
    sync_duration: int
    bytes_at_first_barrier: int
    out_pending: int
    snapshot_ms: int = 0
    switched_ms: int | None = None
    backpressured: bool = False
    converted: bool = False
    last_barrier_ms: int | None = None
    processed_bytes: int = 0


class CheckpointActions:
    """BarrierActions of a subtask (uses its ``gate``, ``outputs``, ``writers``, ``operators``, ``pending``)."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def snapshot(self, barrier: CheckpointBarrier, unaligned: bool, first_barrier_ms: int) -> None:
        t0 = time.perf_counter()
        states = {op.id: op.snapshot(barrier.checkpoint_id) for op in self.operators}
        blob = pickle.dumps({"operators": states}, protocol=5) if any(s is not None for s in states.values()) else None
        offsets = self.source.offsets() if self.source is not None else None
        writer = ChannelStateWriter()
        writer.start(barrier.checkpoint_id)
        self.pending[barrier.checkpoint_id] = PendingCheckpoint(
            barrier=barrier,
            writer=writer,
            operator_state=blob,
            source_offsets=offsets,
            unaligned=unaligned,
            first_barrier_ms=first_barrier_ms,
            sync_duration=int((time.perf_counter() - t0) * 1000),
            bytes_at_first_barrier=self.bytes_in,
            out_pending=0,
            snapshot_ms=self.now_ms(),
            switched_ms=self.now_ms() if unaligned and barrier.policy == "aligned_then_unaligned" else None,
            backpressured=bool(self.outputs) and not self._outputs_available(),
        )

    def forward_barrier(self, barrier: CheckpointBarrier, priority: bool) -> None:
        for w in self.writers:
            w.flush_all()
        p = self.pending.get(barrier.checkpoint_id)
        with self.lock:
            for ch in self.outputs:
                if priority:
                    for data, records in ch.add_priority_barrier(barrier):
                        if p is not None:
                            p.writer.add_output_data(ch.info, data, records)
                else:
                    ch.add_barrier(barrier)
            if p is not None:
                p.out_pending = len(self.outputs)
                if priority:
                    p.converted = True
                if not self.outputs:
                    p.writer.finish_output()

    def block(self, channel: int) -> None:
        self.gate.channels[channel].blocked = True

    def unblock_all(self) -> None:
        for ch in self.gate.channels:
            ch.blocked = False

    def start_recording(self, channel: int, checkpoint_id: int) -> None:
        ch = self.gate.channels[channel]
        ch.recording = checkpoint_id
        cur = self.current
        p = self.pending.get(checkpoint_id)
        if cur is not None and cur.channel == channel and cur.has_next() and p is not None:
            # the barrier overtook the unprocessed rest of the buffer in hand: a byte range of it
            p.writer.add_input_data(ch.info, cur.rest())

    def stop_recording(self, channel: int) -> None:
        ch = self.gate.channels[channel]
        p = self.pending.get(ch.recording) if ch.recording is not None else None
        if p is not None:
            for data in self._overtaken.get(channel, ()):
                p.writer.add_input_data(ch.info, data)
        ch.recording = None

    def finish_input(self, checkpoint_id: int, last_barrier_ms: int) -> None:
        p = self.pending.get(checkpoint_id)
        if p is None:
            return
        p.last_barrier_ms = last_barrier_ms
        p.processed_bytes = self.bytes_in - p.bytes_at_first_barrier
        p.writer.finish_input()

    def abort(self, checkpoint_id: int, reason: str) -> None:
        p = self.pending.pop(checkpoint_id, None)
        if p is not None:
            p.writer.abort()
        self.ack_worker.discard(checkpoint_id)
        self.checkpoint_log.append({"checkpoint_id": checkpoint_id, "aborted": reason})
        if checkpoint_id not in self._coordinator_aborted:
            self.ack_worker.decline(checkpoint_id, f"{self.spec.vertex}[{self.spec.subtask_index}]: {reason}")

    # ================================================================================== network callbacks

    def _on_barrier_sent(self, checkpoint_id: int) -> None:
        """Called by a sender thread (lock held) when a barrier left an output queue."""
        p = self.pending.get(checkpoint_id)
        if p is not None:
            p.out_pending -= 1
            if p.out_pending <= 0:
                p.writer.finish_output()

    def _convert_output_barriers(self, checkpoint_id: int) -> None:
        """Turn this checkpoint's aligned barriers still queued in outputs into priority barriers."""
        p = self.pending.get(checkpoint_id)
        if p is None or p.converted:
            return
        if p.barrier.policy == "aligned":
            # a barrier sent aligned on purpose (a savepoint, a source's final checkpoint) stays behind its data:
            # a source ends once its final checkpoint completed, and must not leave overtaken buffers behind
            return
        with self.lock:
            for ch in self.outputs:
                overtaken = ch.convert_barrier(checkpoint_id)
                if overtaken is not None:
                    p.unaligned = True
                    p.switched_ms = p.switched_ms or self.now_ms()
                    for data, records in overtaken:
                        p.writer.add_output_data(ch.info, data, records)
            p.converted = True

    def _complete_checkpoints(self) -> None:
        for cid in [c for c, p in self.pending.items() if p.writer.done]:
            p = self.pending.pop(cid)
            result = p.writer.result()
            metrics = {
                "sync_duration": p.sync_duration,
                "alignment_duration": max(0, (p.last_barrier_ms or p.first_barrier_ms) - p.first_barrier_ms),
                "start_delay": max(0, p.first_barrier_ms - p.barrier.trigger_timestamp),
                "processed_data": p.processed_bytes,
                "persisted_data": result.persisted_bytes,
                "unaligned": p.unaligned,
            }
            self.checkpoint_log.append(
                {"checkpoint_id": cid, "unaligned": p.unaligned, "persisted": result.persisted_bytes,
                 "segments": len(result.segments), "policy": p.barrier.policy,
                 "trigger_timestamp": p.barrier.trigger_timestamp, "alignment_timeout": p.barrier.alignment_timeout,
                 "snapshot_ms": p.snapshot_ms, "switched_ms": p.switched_ms,
                 "backpressured": p.backpressured}
            )
            self.ack_worker.submit(
                CheckpointUpload(
                    checkpoint_id=cid,
                    operator_state=p.operator_state,
                    channel_state=result.data if result.segments else None,
                    channel_segments=result.segments,
                    source_offsets=p.source_offsets,
                    key_group_range=self.keyed_range,
                    metrics=metrics,
                )
            )
