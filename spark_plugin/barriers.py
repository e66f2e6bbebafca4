"""Checkpoint barriers and the subtask's barrier handling, written as one small class per barrier state.

The states follow Flink's ``SingleCheckpointBarrierHandler``: :class:`WaitingForFirstBarrier`,
:class:`CollectingAligned`, :class:`CollectingAlignedUntilTimeout` (``aligned_then_unaligned``) and
:class:`CollectingUnaligned`. Every event method of a state returns the next state. The states never touch
sockets, buffers or the coordinator: they call a :class:`BarrierActions` (the subtask, or a recording fake in
tests), so every transition can be driven by scripted channel events.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

ALIGNED = "aligned"
UNALIGNED = "unaligned"
ALIGNED_THEN_UNALIGNED = "aligned_then_unaligned"
POLICIES = (ALIGNED, UNALIGNED, ALIGNED_THEN_UNALIGNED)


@dataclass(frozen=True)
class CheckpointBarrier:
    """The marker of checkpoint ``checkpoint_id`` that travels with the data.

    ``unaligned`` is True when the barrier travels as a priority event (it overtook buffers); a barrier of an
    ``aligned_then_unaligned`` checkpoint starts aligned and turns unaligned past ``deadline``.
    """

    checkpoint_id: int
    trigger_timestamp: int
    policy: str = ALIGNED
    alignment_timeout: int | None = None
    is_savepoint: bool = False
    unaligned: bool = False

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown barrier policy {self.policy!r}; use one of {', '.join(POLICIES)}")

    @property
    def deadline(self) -> int | None:
        """Epoch ms at which an aligned_then_unaligned alignment switches to unaligned (None: never)."""
        if self.policy != ALIGNED_THEN_UNALIGNED or self.alignment_timeout is None or self.is_savepoint:
            return None
        return self.trigger_timestamp + self.alignment_timeout

    @property
    def starts_unaligned(self) -> bool:
        return self.unaligned or (self.policy == UNALIGNED and not self.is_savepoint)

    def as_unaligned(self) -> CheckpointBarrier:
        return replace(self, unaligned=True)

    def to_dict(self) -> dict:
        return {
            "checkpoint_id": self.checkpoint_id,
            "trigger_timestamp": self.trigger_timestamp,
            "policy": self.policy,
            "alignment_timeout": self.alignment_timeout,
            "is_savepoint": self.is_savepoint,
            "unaligned": self.unaligned,
        }

    @classmethod
    def from_dict(cls, d: dict) -> CheckpointBarrier:
        return cls(**d)


class BarrierActions(Protocol):
    """What the barrier states ask of their subtask."""

    def snapshot(self, barrier: CheckpointBarrier, unaligned: bool, first_barrier_ms: int) -> None:
        """Snapshot operator state for the barrier's checkpoint and open its channel-state writer."""

    def forward_barrier(self, barrier: CheckpointBarrier, priority: bool) -> None:
        """Send the barrier on every output channel: at the head (priority) or at the tail of the queue."""

    def block(self, channel: int) -> None:
        """Stop consuming ``channel`` (its barrier arrived during alignment)."""

    def unblock_all(self) -> None:
        """Resume consuming every channel."""

    def start_recording(self, channel: int, checkpoint_id: int) -> None:
        """Persist the unprocessed data of ``channel`` received before its barrier, from now until it arrives."""

    def stop_recording(self, channel: int) -> None:
        """The barrier of ``channel`` arrived: persist what it overtook and stop recording the channel."""

    def finish_input(self, checkpoint_id: int, last_barrier_ms: int) -> None:
        """Every input channel delivered its barrier; the input side of the channel state is complete."""

    def abort(self, checkpoint_id: int, reason: str) -> None:
        """Discard the checkpoint's work and decline it."""

    def now_ms(self) -> int:
        """The current time in epoch milliseconds."""


class BarrierState:
    """One state of barrier handling; every method returns the next state."""

    def __init__(self, handler: BarrierHandler) -> None:
        self.handler = handler

    @property
    def actions(self) -> BarrierActions:
        return self.handler.actions

    checkpoint_id: int | None = None

    def on_barrier(self, channel: int, barrier: CheckpointBarrier) -> BarrierState:
        raise NotImplementedError

    def on_trigger(self, barrier: CheckpointBarrier) -> BarrierState:
        """A source subtask (no input channels) starts a checkpoint on the coordinator's trigger."""
        return self

    def on_timer(self, now_ms: int) -> BarrierState:
        return self

    def on_switch_to_unaligned(self, checkpoint_id: int) -> BarrierState:
        return self

    def on_abort(self, checkpoint_id: int, reason: str) -> BarrierState:
        return self

    def on_channel_ended(self, channel: int) -> BarrierState:
        return self

    def deadline(self) -> int | None:
        return None


class WaitingForFirstBarrier(BarrierState):
    """No checkpoint in progress: the first barrier of a newer checkpoint starts one."""

    def on_barrier(self, channel: int, barrier: CheckpointBarrier) -> BarrierState:
        h = self.handler
        if barrier.checkpoint_id <= h.latest_checkpoint_id:
            return self  # a late barrier of a checkpoint already taken, aborted or superseded
        h.latest_checkpoint_id = barrier.checkpoint_id
        now = self.actions.now_ms()
        if barrier.starts_unaligned or barrier.checkpoint_id in h.switched:
            return CollectingUnaligned.start(h, channel, barrier.as_unaligned(), now)
        if barrier.deadline is not None:
            if now >= barrier.deadline:
                return CollectingUnaligned.start(h, channel, barrier.as_unaligned(), now)
            return CollectingAlignedUntilTimeout(h, barrier, now).on_barrier(channel, barrier)
        return CollectingAligned(h, barrier, now).on_barrier(channel, barrier)

    def on_trigger(self, barrier: CheckpointBarrier) -> BarrierState:
        h = self.handler
        if barrier.checkpoint_id <= h.latest_checkpoint_id:
            return self
        h.latest_checkpoint_id = barrier.checkpoint_id
        now = self.actions.now_ms()
        unaligned = barrier.starts_unaligned or barrier.checkpoint_id in h.switched
        if unaligned:
            barrier = barrier.as_unaligned()
        self.actions.snapshot(barrier, unaligned, now)
        self.actions.forward_barrier(barrier, priority=unaligned)
        self.actions.finish_input(barrier.checkpoint_id, now)
        return self


class CollectingAligned(BarrierState):
    """Aligned: each channel blocks on its barrier; when all arrived, snapshot, forward and unblock."""

    def __init__(self, handler: BarrierHandler, barrier: CheckpointBarrier, first_barrier_ms: int) -> None:
        super().__init__(handler)
        self.barrier = barrier
        self.checkpoint_id = barrier.checkpoint_id
        self.first_barrier_ms = first_barrier_ms
        self.arrived: set[int] = set()

    def on_barrier(self, channel: int, barrier: CheckpointBarrier) -> BarrierState:
        cid = barrier.checkpoint_id
        if cid < self.checkpoint_id:
            return self
        if cid > self.checkpoint_id:
            self._abandon(f"checkpoint {self.checkpoint_id} superseded by checkpoint {cid}")
            return WaitingForFirstBarrier(self.handler).on_barrier(channel, barrier)
        if barrier.unaligned:
            # an upstream subtask timed out and sent this barrier as a priority event: follow it
            return self._switch(channel)
        self.arrived.add(channel)
        if self.arrived >= self.handler.live_channels():
            now = self.actions.now_ms()
            self.actions.snapshot(self.barrier, False, self.first_barrier_ms)
            self.actions.forward_barrier(self.barrier, priority=False)
            self.actions.unblock_all()
            self.actions.finish_input(self.checkpoint_id, now)
            return WaitingForFirstBarrier(self.handler)
        self.actions.block(channel)
        return self

    def on_channel_ended(self, channel: int) -> BarrierState:
        if self.arrived >= self.handler.live_channels():
            return self._complete_without_barrier()
        return self

    def _complete_without_barrier(self) -> BarrierState:
        now = self.actions.now_ms()
        self.actions.snapshot(self.barrier, False, self.first_barrier_ms)
        self.actions.forward_barrier(self.barrier, priority=False)
        self.actions.unblock_all()
        self.actions.finish_input(self.checkpoint_id, now)
        return WaitingForFirstBarrier(self.handler)

    def on_switch_to_unaligned(self, checkpoint_id: int) -> BarrierState:
        if checkpoint_id != self.checkpoint_id or self.barrier.policy == ALIGNED:
            return self  # an aligned checkpoint (a savepoint, a source's final checkpoint) never switches
        return self._switch(None)

    def on_abort(self, checkpoint_id: int, reason: str) -> BarrierState:
        if checkpoint_id != self.checkpoint_id:
            return self
        self.actions.unblock_all()
        self.actions.abort(checkpoint_id, reason)
        return WaitingForFirstBarrier(self.handler)

    def _abandon(self, reason: str) -> None:
        self.actions.unblock_all()
        self.actions.abort(self.checkpoint_id, reason)

    def _switch(self, channel: int | None) -> BarrierState:
        """Turn this alignment unaligned on the spot: the blocked channels need nothing persisted."""
        barrier = self.barrier.as_unaligned()
        self.actions.snapshot(barrier, True, self.first_barrier_ms)
        self.actions.forward_barrier(barrier, priority=True)
        self.actions.unblock_all()
        state = CollectingUnaligned(self.handler, barrier, self.first_barrier_ms, set(self.arrived))
        for ch in sorted(self.handler.live_channels() - self.arrived):
            self.actions.start_recording(ch, self.checkpoint_id)
        if channel is not None:
            return state.on_barrier(channel, barrier)
        return state.maybe_done()


class CollectingAlignedUntilTimeout(CollectingAligned):
    """aligned_then_unaligned: aligned until trigger time + alignment timeout, then unaligned on the spot."""

    def deadline(self) -> int | None:
        return self.barrier.deadline

    def on_timer(self, now_ms: int) -> BarrierState:
        deadline = self.barrier.deadline
        if deadline is not None and now_ms >= deadline:
            return self._switch(None)
        return self


class CollectingUnaligned(BarrierState):
    """Unaligned: snapshot taken on the first barrier; record each channel until its barrier arrives."""

    def __init__(
        self, handler: BarrierHandler, barrier: CheckpointBarrier, first_barrier_ms: int, arrived: set[int]
    ) -> None:
        super().__init__(handler)
        self.barrier = barrier
        self.checkpoint_id = barrier.checkpoint_id
        self.first_barrier_ms = first_barrier_ms
        self.arrived = arrived

    @classmethod
    def start(
        cls, handler: BarrierHandler, channel: int, barrier: CheckpointBarrier, now: int
    ) -> BarrierState:
        """Snapshot on the first barrier, forward it at the head of every output, record the other channels."""
        handler.actions.snapshot(barrier, True, now)
        handler.actions.forward_barrier(barrier, priority=True)
        state = cls(handler, barrier, now, set())
        for ch in sorted(handler.live_channels()):
            handler.actions.start_recording(ch, barrier.checkpoint_id)
        return state.on_barrier(channel, barrier)

    def on_barrier(self, channel: int, barrier: CheckpointBarrier) -> BarrierState:
        cid = barrier.checkpoint_id
        if cid < self.checkpoint_id:
            return self
        if cid > self.checkpoint_id:
            self._abandon(f"checkpoint {self.checkpoint_id} superseded by checkpoint {cid}")
            return WaitingForFirstBarrier(self.handler).on_barrier(channel, barrier)
        if channel in self.arrived:
            return self
        self.arrived.add(channel)
        self.actions.stop_recording(channel)
        return self.maybe_done()

    def on_channel_ended(self, channel: int) -> BarrierState:
        if channel not in self.arrived:
            self.actions.stop_recording(channel)
        return self.maybe_done()

    def maybe_done(self) -> BarrierState:
        if self.arrived >= self.handler.live_channels():
            self.actions.finish_input(self.checkpoint_id, self.actions.now_ms())
            return WaitingForFirstBarrier(self.handler)
        return self

    def on_abort(self, checkpoint_id: int, reason: str) -> BarrierState:
        if checkpoint_id != self.checkpoint_id:
            return self
        self._abandon(reason)
        return WaitingForFirstBarrier(self.handler)

    def _abandon(self, reason: str) -> None:
        for ch in sorted(self.handler.live_channels() - self.arrived):
            self.actions.stop_recording(ch)
        self.actions.abort(self.checkpoint_id, reason)


class BarrierHandler:
    """Holds the current barrier state of one subtask and feeds it events."""

    def __init__(self, num_channels: int, actions: BarrierActions, latest_checkpoint_id: int = 0) -> None:
        self.num_channels = num_channels
        self.actions = actions
        self.latest_checkpoint_id = latest_checkpoint_id
        self.ended: set[int] = set()
        self.switched: set[int] = set()
        self.state: BarrierState = WaitingForFirstBarrier(self)

    def live_channels(self) -> set[int]:
        """Channels that can still deliver a barrier (not ended)."""
        return set(range(self.num_channels)) - self.ended

    @property
    def pending_checkpoint(self) -> int | None:
        return self.state.checkpoint_id

    def on_barrier(self, channel: int, barrier: CheckpointBarrier) -> None:
        self.state = self.state.on_barrier(channel, barrier)

    def on_trigger(self, barrier: CheckpointBarrier) -> None:
        if self.num_channels:
            raise RuntimeError("only a subtask without input channels (a source) acts on triggers")
        self.state = self.state.on_trigger(barrier)

    def on_timer(self, now_ms: int) -> None:
        self.state = self.state.on_timer(now_ms)

    def on_switch_to_unaligned(self, checkpoint_id: int) -> None:
        """The coordinator's ``checkpoint.switch_to_unaligned``: obeyed now, or on the first barrier."""
        self.switched.add(checkpoint_id)
        self.state = self.state.on_switch_to_unaligned(checkpoint_id)

    def on_abort(self, checkpoint_id: int, reason: str) -> None:
        if checkpoint_id > self.latest_checkpoint_id:
            self.latest_checkpoint_id = checkpoint_id  # never start a checkpoint that is already aborted
        self.state = self.state.on_abort(checkpoint_id, reason)

    def on_channel_ended(self, channel: int) -> None:
        self.ended.add(channel)
        self.state = self.state.on_channel_ended(channel)

    def deadline(self) -> int | None:
        return self.state.deadline()
