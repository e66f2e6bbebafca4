"""The barrier states, one small class each (Flink's ``BarrierHandlerState``), the actions they may take, and the
state each barrier policy starts in (:data:`FIRST_STATE`).

``spark_plugin.task.barriers.BarrierHandler`` holds the current state and is the only one that changes the current
checkpoint: a barrier of a newer checkpoint (or a source's trigger) starts one in the first state its policy names
in :data:`FIRST_STATE`. Every event method of a state receives the :class:`BarrierActions` it may take as an argument and returns the next
state. States never touch sockets, buffers or the coordinator, so every transition can be driven by scripted events.

**In-flight budget.** A barrier may carry the most in-flight bytes the subtask may persist for its checkpoint. The
check comes at the moment a subtask would go unaligned (its first barrier for an unaligned checkpoint, the
alignment timeout, an upstream's priority barrier), before the snapshot: once an unaligned snapshot is taken, every
other channel's data up to its barrier must be persisted. Over budget, the checkpoint finishes aligned
(:class:`CollectingAlignedOverBudget`) or is declined, as the barrier's ``over_inflight_budget`` says.

Adding a barrier policy means one ``BarrierPolicy`` value (``contract.models``), one entry in :data:`FIRST_STATE`,
and one coordinator rule (``app.domain.policies``).
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from contract.models import BarrierPolicy
from spark_plugin.network.barrier import CheckpointBarrier


class BarrierActions(Protocol):
    """What barrier states may do to their subtask."""

    def live_channels(self) -> set[int]:
        """Input channels that can still deliver a barrier (not ended)."""

    def now_ms(self) -> int:
        """The current time in epoch milliseconds."""

    def recovering(self) -> bool:
        """Whether the subtask still replays the in-flight data it restored and may not take a checkpoint meanwhile
        (``NetworkConfig.checkpoints_during_recovery`` off, or a rescaled restore)."""

    def first_barrier(self, checkpoint_id: int) -> None:
        """The checkpoint's first barrier arrived: the bytes it reports as processed count from now."""

    def snapshot(self, barrier: CheckpointBarrier, unaligned: bool, first_barrier_ms: int) -> None:
        """Snapshot operator state for the barrier's checkpoint and start recording its channel state."""

    def forward_barrier(self, barrier: CheckpointBarrier, priority: bool) -> None:
        """Send the barrier on every output channel: at the head (priority) or at the tail of the queue."""

    def block(self, channel: int) -> None:
        """Stop consuming ``channel`` (its barrier arrived during alignment)."""

    def unblock_all(self) -> None:
        """Resume consuming every channel."""

    def block_overtaken(self, channel: int, checkpoint_id: int) -> None:
        """Stop consuming ``channel`` at once: the buffers its priority barrier overtook stay queued, unprocessed,
        until the snapshot persists them (last-barrier checkpoints)."""

    def start_persisting(self, channel: int, checkpoint_id: int) -> None:
        """Persist the in-flight data of ``channel`` for the checkpoint until its barrier arrives there."""

    def stop_persisting(self, channel: int, checkpoint_id: int) -> None:
        """The checkpoint's barrier arrived on ``channel``: persist what it overtook, then stop."""

    def inflight_bytes(self, checkpoint_id: int, channels: set[int]) -> int:
        """The bytes an unaligned checkpoint would persist if taken now: what ``channels`` queue ahead of its
        barrier (and the rest of the buffer in hand from them), and every output buffer a priority barrier would
        overtake."""

    def hold_barriers(self, checkpoint_id: int, inflight_bytes: int) -> None:
        """The checkpoint is over its in-flight budget: its barriers stop overtaking (each stays at its arrival
        position in its channel) and it is taken aligned, its barrier sent in band."""

    def finish_input(self, checkpoint_id: int, last_barrier_ms: int) -> None:
        """Every input channel delivered its barrier; the input side of the channel state is complete."""

    def abort(self, checkpoint_id: int, reason: str) -> None:
        """Discard the checkpoint's work and decline it."""

    def regenerates(self, channel: int) -> bool:
        """Whether ``channel``'s upstream regenerates what it sent (``spark_plugin.task.regeneration``): a
        last-barrier checkpoint persists none of it here."""

    def regenerates_output(self) -> bool:
        """Whether this subtask regenerates its output: its last-barrier snapshot logs the inputs of what its
        barrier, forwarded with priority, overtakes."""


class BarrierState:
    """One state of barrier handling; every event method returns the next state."""

    checkpoint_id: int | None = None

    def barrier_received(self, actions: BarrierActions, channel: int, barrier: CheckpointBarrier) -> BarrierState:
        return self

    def timer(self, actions: BarrierActions, now_ms: int) -> BarrierState:
        return self

    def switch_to_unaligned(self, actions: BarrierActions) -> BarrierState:
        return self

    def channel_ended(self, actions: BarrierActions, channel: int) -> BarrierState:
        return self

    def abandon(self, actions: BarrierActions, reason: str) -> BarrierState:
        return self

    def maybe_done(self, actions: BarrierActions) -> BarrierState:
        return self

    def deadline(self) -> int | None:
        return None


class WaitingForFirstBarrier(BarrierState):
    """No checkpoint in progress."""


WAITING = WaitingForFirstBarrier()


class CollectingBarriers(BarrierState):
    """A checkpoint in progress: its barrier, when its first barrier came, and the channels whose barrier arrived."""

    takes_priority_barriers: ClassVar[bool] = False
    """Whether the state handles barriers that came as priority events itself; if not, such a barrier (or a switch
    already announced, or a passed deadline) starts the checkpoint first-barrier unaligned."""

    def __init__(self, barrier: CheckpointBarrier, first_barrier_ms: int, arrived: set[int] | None = None) -> None:
        self.barrier = barrier
        self.checkpoint_id = barrier.checkpoint_id
        self.first_barrier_ms = first_barrier_ms
        self.arrived: set[int] = arrived if arrived is not None else set()

    def begin(self, actions: BarrierActions) -> BarrierState:
        """The checkpoint starts (its first barrier arrived, before it is received on its channel)."""
        return self

    def trigger(self, actions: BarrierActions) -> None:
        """A subtask without input channels (a source) takes the checkpoint at once, on the coordinator's trigger."""
        raise NotImplementedError

    def all_arrived(self, actions: BarrierActions) -> bool:
        return self.arrived >= actions.live_channels()

    def over_budget(self, actions: BarrierActions, channels: set[int]) -> BarrierState | None:
        """About to go unaligned with ``channels`` still to persist: None when within the in-flight budget, else the
        next state (aligned to the end, or none: the checkpoint is declined)."""
        budget = self.barrier.inflight_budget
        if budget is None:
            return None
        inflight = actions.inflight_bytes(self.checkpoint_id, channels)
        if not self.barrier.over_budget(inflight):
            return None
        if self.barrier.over_inflight_budget == "abort":
            actions.unblock_all()
            actions.abort(
                self.checkpoint_id,
                f"{inflight} bytes in flight would pass the checkpoint's in-flight budget of {budget} bytes "
                "(over_inflight_budget=abort); raise the budget or let the checkpoint finish aligned",
            )
            return WAITING
        actions.hold_barriers(self.checkpoint_id, inflight)
        return CollectingAlignedOverBudget(self.barrier.as_aligned(), self.first_barrier_ms, set(self.arrived))


class CollectingAligned(CollectingBarriers):
    """Aligned: each channel blocks on its barrier; when all arrived, snapshot, forward at the tail and unblock."""

    def trigger(self, actions: BarrierActions) -> None:
        now = actions.now_ms()
        actions.snapshot(self.barrier, False, now)
        actions.forward_barrier(self.barrier, priority=False)
        actions.finish_input(self.checkpoint_id, now)

    def barrier_received(self, actions: BarrierActions, channel: int, barrier: CheckpointBarrier) -> BarrierState:
        if barrier.unaligned:
            # an upstream subtask switched and sent this barrier as a priority event: follow it
            return self._switch(actions).barrier_received(actions, channel, barrier)
        self.arrived.add(channel)
        if self.all_arrived(actions):
            return self._complete(actions)
        actions.block(channel)
        return self

    def channel_ended(self, actions: BarrierActions, channel: int) -> BarrierState:
        return self._complete(actions) if self.all_arrived(actions) else self

    def _complete(self, actions: BarrierActions) -> BarrierState:
        now = actions.now_ms()
        actions.snapshot(self.barrier, False, self.first_barrier_ms)
        actions.forward_barrier(self.barrier, priority=False)
        actions.unblock_all()
        actions.finish_input(self.checkpoint_id, now)
        return WAITING

    def switch_to_unaligned(self, actions: BarrierActions) -> BarrierState:
        if self.barrier.deadline is None:
            return self  # an aligned checkpoint (a savepoint, a source's final checkpoint) never switches
        return self._switch(actions).maybe_done(actions)

    def abandon(self, actions: BarrierActions, reason: str) -> BarrierState:
        actions.unblock_all()
        actions.abort(self.checkpoint_id, reason)
        return WAITING

    def _switch(self, actions: BarrierActions) -> BarrierState:
        """Turn this alignment unaligned on the spot: the blocked channels need nothing persisted (unless the rest is
        over the in-flight budget)."""
        fallback = self.over_budget(actions, actions.live_channels() - self.arrived)
        if fallback is not None:
            return fallback
        barrier = self.barrier.as_unaligned()
        actions.snapshot(barrier, True, self.first_barrier_ms)
        actions.forward_barrier(barrier, priority=True)
        actions.unblock_all()
        for ch in sorted(actions.live_channels() - self.arrived):
            actions.start_persisting(ch, self.checkpoint_id)
        return CollectingUnaligned(barrier, self.first_barrier_ms, set(self.arrived))


class CollectingAlignedOverBudget(CollectingAligned):
    """Aligned because going unaligned would pass the in-flight budget: nothing is persisted, nothing switches.

    Barriers of the checkpoint stay at their arrival positions in their channels (``hold_barriers``): a priority
    barrier that still reaches the state is one announced before the hold, whose marker now waits in band; the
    channel blocks when the subtask reaches it."""

    def barrier_received(self, actions: BarrierActions, channel: int, barrier: CheckpointBarrier) -> BarrierState:
        if barrier.unaligned:
            return self  # its marker is back at its arrival position: the channel blocks when it gets there
        return super().barrier_received(actions, channel, barrier)

    def switch_to_unaligned(self, actions: BarrierActions) -> BarrierState:
        return self

    def maybe_done(self, actions: BarrierActions) -> BarrierState:
        return self._complete(actions) if self.all_arrived(actions) else self


class CollectingAlignedUntilTimeout(CollectingAligned):
    """aligned_then_unaligned: aligned until trigger time + alignment timeout, then unaligned on the spot."""

    def deadline(self) -> int | None:
        return self.barrier.deadline

    def timer(self, actions: BarrierActions, now_ms: int) -> BarrierState:
        deadline = self.barrier.deadline
        if deadline is not None and now_ms >= deadline:
            return self._switch(actions).maybe_done(actions)
        return self


class CollectingUnaligned(CollectingBarriers):
    """Unaligned: snapshot on the first barrier, forward it with priority, persist each other channel's in-flight
    data until its barrier arrives; never block."""

    def __init__(self, barrier: CheckpointBarrier, first_barrier_ms: int, arrived: set[int] | None = None) -> None:
        super().__init__(barrier.as_unaligned(), first_barrier_ms, arrived)

    def begin(self, actions: BarrierActions) -> BarrierState:
        fallback = self.over_budget(actions, actions.live_channels())
        if fallback is not None:
            return fallback
        actions.snapshot(self.barrier, True, self.first_barrier_ms)
        actions.forward_barrier(self.barrier, priority=True)
        for ch in sorted(actions.live_channels()):
            actions.start_persisting(ch, self.checkpoint_id)
        return self

    def trigger(self, actions: BarrierActions) -> None:
        fallback = self.over_budget(actions, set())
        if fallback is not None:
            if isinstance(fallback, CollectingBarriers):
                fallback.trigger(actions)
            return
        now = actions.now_ms()
        actions.snapshot(self.barrier, True, now)
        actions.forward_barrier(self.barrier, priority=True)
        actions.finish_input(self.checkpoint_id, now)

    def barrier_received(self, actions: BarrierActions, channel: int, barrier: CheckpointBarrier) -> BarrierState:
        if channel in self.arrived:
            return self
        self.arrived.add(channel)
        actions.stop_persisting(channel, self.checkpoint_id)
        return self.maybe_done(actions)

    def channel_ended(self, actions: BarrierActions, channel: int) -> BarrierState:
        if channel not in self.arrived:
            actions.stop_persisting(channel, self.checkpoint_id)
        return self.maybe_done(actions)

    def maybe_done(self, actions: BarrierActions) -> BarrierState:
        if self.all_arrived(actions):
            actions.finish_input(self.checkpoint_id, actions.now_ms())
            return WAITING
        return self

    def abandon(self, actions: BarrierActions, reason: str) -> BarrierState:
        for ch in sorted(actions.live_channels() - self.arrived):
            actions.stop_persisting(ch, self.checkpoint_id)
        actions.abort(self.checkpoint_id, reason)
        return WAITING


class CollectingLastBarrier(CollectingBarriers):
    """unaligned_last_barrier: barriers overtake, the snapshot waits for the last one.

    A priority barrier blocks its channel at once: the buffers it overtook in the channel's queue stay there,
    unprocessed. A barrier that comes in band (from an upstream that forwarded it so) blocks its channel where it
    is, everything before it processed. Channels without a barrier keep being processed. When the last barrier
    arrives the subtask snapshots, persists what each priority barrier overtook (and the unread rest of the buffer
    in hand, which came from one of those channels) as input channel state, forwards its barrier *in band* and
    unblocks: every record it emitted before the snapshot reaches its consumers ahead of the barrier and is
    processed there, so none of its outputs is persisted; only the inputs its barriers overtook are. A source
    (``trigger``) forwards with priority: its barrier overtakes its output queue, which it persists."""

    takes_priority_barriers = True

    def __init__(self, barrier: CheckpointBarrier, first_barrier_ms: int, arrived: set[int] | None = None) -> None:
        super().__init__(barrier, first_barrier_ms, arrived)
        self.overtook: set[int] = set()
        """Channels whose barrier came with priority: what it overtook is persisted at the snapshot."""

    def trigger(self, actions: BarrierActions) -> None:
        now = actions.now_ms()
        barrier = self.barrier.as_unaligned()
        actions.snapshot(barrier, True, now)
        actions.forward_barrier(barrier, priority=True)
        actions.finish_input(self.checkpoint_id, now)

    def barrier_received(self, actions: BarrierActions, channel: int, barrier: CheckpointBarrier) -> BarrierState:
        if channel in self.arrived:
            return self
        self.arrived.add(channel)
        if barrier.unaligned:
            self.overtook.add(channel)
        if self.all_arrived(actions):
            return self._complete(actions)
        if barrier.unaligned:
            actions.block_overtaken(channel, self.checkpoint_id)
        else:
            actions.block(channel)
        return self

    def channel_ended(self, actions: BarrierActions, channel: int) -> BarrierState:
        return self._complete(actions) if self.all_arrived(actions) else self

    def maybe_done(self, actions: BarrierActions) -> BarrierState:
        return self._complete(actions) if self.all_arrived(actions) else self

    def _complete(self, actions: BarrierActions) -> BarrierState:
        now = actions.now_ms()
        actions.snapshot(self.barrier, bool(self.overtook), self.first_barrier_ms)
        for ch in sorted(self.overtook & actions.live_channels()):
            if actions.regenerates(ch):
                continue  # its upstream logged the inputs of what the barrier overtook: nothing persisted here
            actions.start_persisting(ch, self.checkpoint_id)  # the rest of the buffer in hand, if it is this one's
            actions.stop_persisting(ch, self.checkpoint_id)  # and the buffers queued ahead of the barrier
        if actions.regenerates_output():
            # its snapshot logged the inputs of its queued outputs: the barrier overtakes them, nothing is persisted
            actions.forward_barrier(self.barrier.as_unaligned(), priority=True)
        else:
            actions.forward_barrier(self.barrier.as_aligned(), priority=False)
        actions.unblock_all()
        actions.finish_input(self.checkpoint_id, now)
        return WAITING

    def abandon(self, actions: BarrierActions, reason: str) -> BarrierState:
        actions.unblock_all()
        actions.abort(self.checkpoint_id, reason)
        return WAITING


FIRST_STATE: dict[BarrierPolicy, type[CollectingBarriers]] = {
    BarrierPolicy.aligned: CollectingAligned,
    BarrierPolicy.unaligned: CollectingUnaligned,
    BarrierPolicy.unaligned_last_barrier: CollectingLastBarrier,
    BarrierPolicy.aligned_then_unaligned: CollectingAlignedUntilTimeout,
}
"""The state a checkpoint of each policy starts in."""
