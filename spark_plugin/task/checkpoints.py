"""The subtask's side of a checkpoint: the actions barrier states take, its pending checkpoints, and their hand-over
to the ack worker once their channel state is complete.

:class:`CheckpointController` implements :class:`~spark_plugin.task.barrier_states.BarrierActions` on the subtask's
parts: it snapshots the operator chain, has the output partition send barriers, has input channels persist their
in-flight data, and collects what each checkpoint needs for its ack.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from contract.models import BarrierPolicy, ChannelSegment
from spark_plugin.network.barrier import CheckpointBarrier
from spark_plugin.network.input import InputGate
from spark_plugin.network.partition import OutputPartition
from spark_plugin.task.ack_worker import AckWorker, CheckpointUpload
from spark_plugin.task.chain import OperatorChain
from spark_plugin.task.channel_state import ChannelStateResult, ChannelStateWriter


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class PendingCheckpoint:
    """A checkpoint this subtask snapshotted and whose channel state is still being collected."""

    barrier: CheckpointBarrier
    operator_state: bytes | None
    source_offsets: dict | None
    unaligned: bool
    first_barrier_ms: int
    sync_duration: int
    bytes_at_first_barrier: int
    snapshot_ms: int = 0
    switched_ms: int | None = None
    backpressured: bool = False
    converted: bool = False
    last_barrier_ms: int | None = None
    processed_bytes: int = 0
    during_recovery: bool = False
    """Snapshotted while the subtask still replayed restored in-flight data."""
    over_budget: int | None = None
    """Taken aligned over its in-flight budget: the in-flight bytes seen when it would have gone unaligned."""
    logged_bytes: int = 0
    """The inputs a regenerating subtask logged in place of its in-flight outputs (part of its operator state),
    counted as persisted in-flight data."""


def _whole(result: ChannelStateResult) -> tuple[bytes | None, list[ChannelSegment]]:
    """A checkpoint's channel state as an upload carries it: its bytes (None: none) and its segments."""
    return (result.data or None), result.segments


class CheckpointController:
    """The checkpoint actions of one subtask and its pending checkpoints."""

    def __init__(
        self,
        name: str,
        chain: OperatorChain,
        gate: InputGate,
        partition: OutputPartition,
        writer: ChannelStateWriter,
        ack_worker: AckWorker,
        bytes_in: Callable[[], int],
        in_hand: Callable[[int], bytes | None],
        key_group_range: tuple[int, int] | None,
        during_recovery: bool = False,
        regenerated_inputs: set[int] | None = None,
    ) -> None:
        self.name = name
        self.chain = chain
        self.gate = gate
        self.partition = partition
        self.writer = writer
        self.ack_worker = ack_worker
        self.lock = gate.mailbox.lock
        self._bytes_in = bytes_in
        self._in_hand = in_hand
        self.key_group_range = key_group_range
        self.during_recovery = during_recovery
        """Whether a checkpoint may start while the subtask replays restored in-flight data (the unreplayed rest is
        persisted as that checkpoint's channel state, by the same persisters and partition as any in-flight data)."""
        self.regenerated_inputs = regenerated_inputs or set()
        """Input channels whose upstream regenerates its output (``spark_plugin.task.regeneration``)."""
        self.pending: dict[int, PendingCheckpoint] = {}
        self._bytes_at_first_barrier: dict[int, int] = {}
        self._over_budget: dict[int, int] = {}
        self.aborted_by_coordinator: set[int] = set()
        self.log: list[dict] = []

    # ================================================================================== BarrierActions

    def live_channels(self) -> set[int]:
        return self.gate.live_channels()

    def now_ms(self) -> int:
        return now_ms()

    replaying_in_hand: Callable[[], bool] = staticmethod(lambda: False)
    """Whether the buffer in hand was taken while the gate still recovered (set by the subtask)."""

    def recovering(self) -> bool:
        # the last buffer of a replay counts until it is processed: a regenerating channel's records in it are
        # neither persisted by this subtask nor logged by its upstream in a checkpoint taken meanwhile
        return (self.gate.recovering or self.replaying_in_hand()) and not self.during_recovery

    def first_barrier(self, checkpoint_id: int) -> None:
        # an aligned checkpoint snapshots only when alignment ends: what it processed counts from its first barrier
        self._bytes_at_first_barrier[checkpoint_id] = self._bytes_in()

    def snapshot(self, barrier: CheckpointBarrier, unaligned: bool, first_barrier_ms: int) -> None:
        t0 = time.perf_counter()
        cid = barrier.checkpoint_id
        regenerate = barrier.policy is BarrierPolicy.unaligned_last_barrier
        operator_state = self.chain.snapshot(cid, regenerate=regenerate)
        log = self.chain.output_log
        logged = log.snapshot_bytes if regenerate and log is not None else 0
        source = self.chain.source
        offsets = source.offsets() if source is not None else None
        with self.lock:
            self.writer.start(cid)
        now = self.now_ms()
        over_budget = self._over_budget.pop(cid, None)
        self.pending[cid] = PendingCheckpoint(
            barrier=barrier,
            operator_state=operator_state,
            source_offsets=offsets,
            unaligned=unaligned,
            first_barrier_ms=first_barrier_ms,
            sync_duration=int((time.perf_counter() - t0) * 1000),
            bytes_at_first_barrier=self._bytes_at_first_barrier.pop(cid, self._bytes_in()),
            snapshot_ms=now,
            switched_ms=now if unaligned and barrier.deadline is not None else None,
            backpressured=not self.partition.available(),
            during_recovery=self.gate.recovering,
            over_budget=over_budget,
            converted=over_budget is not None,  # its barrier stays in band: its output never switches
            logged_bytes=logged,
        )

    def forward_barrier(self, barrier: CheckpointBarrier, priority: bool) -> None:
        p = self.pending.get(barrier.checkpoint_id)
        if p is not None and priority:
            p.converted = True
        # a regenerating subtask's last-barrier snapshot logged the inputs of what its barrier overtakes
        persist = not (self.regenerates_output() and barrier.policy is BarrierPolicy.unaligned_last_barrier)
        self.partition.broadcast_barrier(barrier, priority, persist)

    def regenerates(self, channel: int) -> bool:
        return channel in self.regenerated_inputs

    def regenerates_output(self) -> bool:
        return self.chain.output_log is not None

    def block(self, channel: int) -> None:
        self.gate.block(channel)

    def unblock_all(self) -> None:
        self.gate.unblock_all()

    def block_overtaken(self, channel: int, checkpoint_id: int) -> None:
        with self.lock:
            self.gate.block_at_priority(channel, checkpoint_id)

    def start_persisting(self, channel: int, checkpoint_id: int) -> None:
        with self.lock:
            self.gate.start_persisting(channel, checkpoint_id, self._in_hand(channel))

    def stop_persisting(self, channel: int, checkpoint_id: int) -> None:
        with self.lock:
            self.gate.stop_persisting(channel, checkpoint_id)

    def inflight_bytes(self, checkpoint_id: int, channels: set[int]) -> int:
        with self.lock:
            queued = self.gate.inflight_bytes(channels, checkpoint_id) + self.partition.overtakable_bytes()
            in_hand = sum(len(self._in_hand(ch) or b"") for ch in channels)
        return queued + in_hand

    def hold_barriers(self, checkpoint_id: int, inflight_bytes: int) -> None:
        self._over_budget[checkpoint_id] = inflight_bytes
        with self.lock:
            self.gate.hold(checkpoint_id)

    def finish_input(self, checkpoint_id: int, last_barrier_ms: int) -> None:
        p = self.pending.get(checkpoint_id)
        if p is None:
            return
        p.last_barrier_ms = last_barrier_ms
        p.processed_bytes = self._bytes_in() - p.bytes_at_first_barrier
        with self.lock:
            self.writer.finish_input(checkpoint_id)

    def abort(self, checkpoint_id: int, reason: str) -> None:
        """Discard the checkpoint's work; decline it unless the coordinator aborted it."""
        self.drop(checkpoint_id, reason)
        if checkpoint_id not in self.aborted_by_coordinator:
            self.ack_worker.decline(checkpoint_id, f"{self.name}: {reason}")

    # ================================================================================== the rest of a checkpoint

    def aborted(self, checkpoint_id: int, reason: str) -> None:
        """The coordinator aborted the checkpoint (and the barrier handler let go of it): drop whatever of it is
        still here, e.g. its ack waiting to be sent."""
        if checkpoint_id in self.pending:
            self.drop(checkpoint_id, reason)
        self.ack_worker.discard(checkpoint_id)

    def drop(self, checkpoint_id: int, reason: str) -> None:
        self.pending.pop(checkpoint_id, None)
        self._bytes_at_first_barrier.pop(checkpoint_id, None)
        self._over_budget.pop(checkpoint_id, None)
        with self.lock:
            self.writer.abort(checkpoint_id)
            self.gate.abort_persisting(checkpoint_id)
        self.partition.forget(checkpoint_id)
        self.ack_worker.discard(checkpoint_id)
        self.log.append({"checkpoint_id": checkpoint_id, "aborted": reason})

    def switch_output_barriers(self, checkpoint_id: int) -> None:
        """Turn the checkpoint's aligned barriers still queued in outputs into priority barriers (its alignment
        timeout passed, or the coordinator said so); a checkpoint without an alignment timeout never switches."""
        p = self.pending.get(checkpoint_id)
        if p is None or p.converted or p.barrier.deadline is None:
            return
        if self.partition.convert_barrier(checkpoint_id):
            p.unaligned = True
            p.switched_ms = p.switched_ms or self.now_ms()
        p.converted = True

    def switch_due_output_barriers(self, now: int) -> None:
        for cid, p in list(self.pending.items()):
            deadline = p.barrier.deadline
            if not p.converted and deadline is not None and now >= deadline and self.partition.barriers_queued(cid):
                self.switch_output_barriers(cid)

    def next_deadline(self) -> int | None:
        """The earliest alignment deadline of a pending checkpoint whose output barriers may still switch."""
        deadlines = [p.barrier.deadline for p in self.pending.values() if not p.converted]
        return min((d for d in deadlines if d is not None), default=None)

    def taking(self) -> bool:
        """Whether a checkpoint's channel state is still being collected."""
        return bool(self.pending)

    def _on_written(self, cid: int, result: ChannelStateResult) -> Callable[[str, bool], None]:
        """Once the checkpoint's object is written, the writer learns where its buffers lie."""
        return lambda key, whole: self.writer.written(cid, key, result.whole() if whole else result)

    def _in_order(self, ready: list[int]) -> list[int]:
        """Concurrent checkpoints are acknowledged in id order: a ready one of a job with ``max_concurrent`` > 1
        waits while an older one is still pending here (one-at-a-time jobs hand over whatever is ready)."""
        oldest_waiting = min((cid for cid in self.pending if cid not in ready), default=None)
        return [
            cid for cid in ready
            if oldest_waiting is None or cid < oldest_waiting or self.pending[cid].barrier.max_concurrent <= 1
        ]

    def hand_over_ready(self) -> None:
        """Every checkpoint whose channel state is complete goes to the ack worker, oldest first."""
        with self.lock:
            self.writer.newly_ready = False
            ready = self._in_order([cid for cid in self.writer.ready() if cid in self.pending])
            recordings = [self.writer.take_recording(cid) for cid in ready]
        # laid out outside the lock: compressing a large checkpoint's buffers would hold up the channels' threads
        results = [self.writer.lay_out(cid, rec) for cid, rec in zip(ready, recordings, strict=True)]
        for cid, result in zip(ready, results, strict=True):
            p = self.pending.pop(cid)
            metrics = {
                "sync_duration": p.sync_duration,
                "alignment_duration": max(0, (p.last_barrier_ms or p.first_barrier_ms) - p.first_barrier_ms),
                "start_delay": max(0, p.first_barrier_ms - p.barrier.trigger_timestamp),
                "processed_data": p.processed_bytes,
                "persisted_data": result.persisted_bytes + p.logged_bytes,
                "unaligned": p.unaligned,
                "aligned_over_budget": p.over_budget is not None and not p.unaligned,
            }
            self.log.append(
                {"checkpoint_id": cid, "unaligned": p.unaligned, "persisted": result.persisted_bytes + p.logged_bytes,
                 "logged": p.logged_bytes,
                 "referenced": result.referenced_bytes, "written": len(result.data),
                 "segments": len(result.segments), "policy": p.barrier.policy.value,
                 "trigger_timestamp": p.barrier.trigger_timestamp, "alignment_timeout": p.barrier.alignment_timeout,
                 "snapshot_ms": p.snapshot_ms, "switched_ms": p.switched_ms, "backpressured": p.backpressured,
                 "during_recovery": p.during_recovery,
                 "inflight_budget": p.barrier.inflight_budget, "over_budget": p.over_budget}
            )
            self.ack_worker.submit(
                CheckpointUpload(
                    checkpoint_id=cid,
                    operator_state=p.operator_state,
                    channel_state=result.data if result.data else None,
                    channel_segments=result.segments,
                    source_offsets=p.source_offsets,
                    key_group_range=self.key_group_range,
                    metrics=metrics,
                    whole=(lambda result=result: _whole(result.whole())) if result.incremental else None,
                    on_written=self._on_written(cid, result) if self.writer.references_taken else None,
                )
            )
