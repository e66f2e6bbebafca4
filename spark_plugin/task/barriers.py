"""The subtask's barrier handling, written as one small class per barrier state (Flink's ``BarrierHandlerState``).

:class:`BarrierHandler` holds the current state and is the only one that changes the current checkpoint: a barrier
of a newer checkpoint (or a source's trigger) starts one in the first state its policy names in :data:`FIRST_STATE`.
Every event method of a state receives the :class:`BarrierActions` it may take as an argument and returns the next
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

from collections.abc import Callable
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
            actions.start_persisting(ch, self.checkpoint_id)  # the rest of the buffer in hand, if it is this one's
            actions.stop_persisting(ch, self.checkpoint_id)  # and the buffers queued ahead of the barrier
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


class BarrierHandler:
    """Holds one subtask's barrier state and its checkpoint progress, and feeds the state its events.

    **Concurrent unaligned checkpoints.** ``state`` is the newest checkpoint in progress. When the job allows more
    than one pending checkpoint (the barrier's ``max_concurrent``) and both the checkpoint in progress and the newer
    one are unaligned, the older one is not abandoned: it moves to ``older`` and keeps collecting its barriers while
    the newer one snapshots at its own first barrier. Each persists, on every channel whose barrier it still waits
    for, what that channel hands over (barriers arrive on a channel in checkpoint order, so a buffer before barrier
    n on a channel is in n's recording and in that of every newer checkpoint whose barrier has not come there
    either). Beyond ``max_concurrent`` in progress, the oldest is declined. An aligned checkpoint or a savepoint keeps
    the one-at-a-time rule: it abandons every checkpoint in progress, and a newer barrier abandons it.
    """

    def __init__(self, actions: BarrierActions, latest_checkpoint_id: int = 0) -> None:
        self.actions = actions
        self.latest_checkpoint_id = latest_checkpoint_id
        """The newest checkpoint this subtask started, finished, restored or was told is aborted."""
        self.switched: set[int] = set()
        self.state: BarrierState = WAITING
        self.older: dict[int, BarrierState] = {}
        """Older unaligned checkpoints still collecting barriers while ``state`` is a newer one, by id."""

    @property
    def pending_checkpoint(self) -> int | None:
        return self.state.checkpoint_id

    @property
    def in_progress(self) -> list[int]:
        """Every checkpoint whose barriers this subtask still collects, oldest first."""
        newest = [] if self.state.checkpoint_id is None else [self.state.checkpoint_id]
        return sorted(self.older) + newest

    def restored(self, checkpoint_id: int) -> None:
        """The subtask restored ``checkpoint_id``: barriers of it and older ones are late."""
        self.latest_checkpoint_id = max(self.latest_checkpoint_id, checkpoint_id)

    def _starts_unaligned(self, barrier: CheckpointBarrier, now: int) -> bool:
        deadline = barrier.deadline
        return barrier.unaligned or barrier.checkpoint_id in self.switched or (deadline is not None and now >= deadline)

    def _first_state(self, barrier: CheckpointBarrier) -> CollectingBarriers:
        now = self.actions.now_ms()
        first = FIRST_STATE[BarrierPolicy.aligned if barrier.is_savepoint else barrier.policy]
        if first.takes_priority_barriers:
            return first(barrier, now)
        if self._starts_unaligned(barrier, now):
            return CollectingUnaligned(barrier, now)
        return first(barrier, now)

    def _concurrent(self, barrier: CheckpointBarrier) -> bool:
        """Whether the newer barrier's checkpoint runs beside the unaligned ones in progress instead of abandoning
        them: the job allows it, and the newer one starts unaligned (so does every one in progress)."""
        if barrier.max_concurrent <= 1 or barrier.is_savepoint or FIRST_STATE[barrier.policy].takes_priority_barriers:
            return False
        if not all(type(s) is CollectingUnaligned for s in (self.state, *self.older.values()) if s.checkpoint_id):
            return False
        starts = self._starts_unaligned(barrier, self.actions.now_ms())
        return starts or FIRST_STATE[barrier.policy] is CollectingUnaligned

    def _newer(self, barrier: CheckpointBarrier) -> bool:
        """Whether the barrier starts a new checkpoint; an unfinished older one is abandoned for it (or, for
        concurrent unaligned checkpoints, kept in ``older``)."""
        cid = barrier.checkpoint_id
        if cid <= self.latest_checkpoint_id:
            return False
        if self.older or (self.state.checkpoint_id is not None and barrier.max_concurrent > 1):
            self._keep_or_abandon(barrier)
        elif self.state.checkpoint_id is not None:
            self.state = self.state.abandon(
                self.actions, f"checkpoint {self.state.checkpoint_id} superseded by checkpoint {cid}"
            )
        self.latest_checkpoint_id = cid
        return True

    def _keep_or_abandon(self, barrier: CheckpointBarrier) -> None:
        """max_concurrent > 1: keep the unaligned checkpoints in progress beside the newer one, declining the oldest
        beyond the limit; abandon them all when either side is aligned."""
        cid = barrier.checkpoint_id
        concurrent = self._concurrent(barrier)
        if self.state.checkpoint_id is not None:
            self.older[self.state.checkpoint_id] = self.state
            self.state = WAITING
        keep = barrier.max_concurrent - 1 if concurrent else 0
        for old in sorted(self.older)[: max(0, len(self.older) - keep)]:
            reason = (
                f"checkpoint {old} superseded by checkpoint {cid}: more than max_concurrent={barrier.max_concurrent} "
                "unaligned checkpoints in progress"
                if concurrent
                else f"checkpoint {old} superseded by checkpoint {cid}"
            )
            self.older.pop(old).abandon(self.actions, reason)

    def on_barrier(self, channel: int, barrier: CheckpointBarrier) -> None:
        if self._newer(barrier):
            if self.actions.recovering():
                # in-flight data of the restored checkpoint is still being replayed and checkpoints during recovery
                # are off for this subtask (the coordinator triggers none until every subtask reported running;
                # this one came anyway)
                self.actions.abort(barrier.checkpoint_id, "the subtask is still replaying its restored in-flight data")
                return
            self.actions.first_barrier(barrier.checkpoint_id)
            self.state = self._first_state(barrier).begin(self.actions)
        if barrier.checkpoint_id == self.state.checkpoint_id:
            self.state = self.state.barrier_received(self.actions, channel, barrier)
        elif barrier.checkpoint_id in self.older:
            self._older_event(barrier.checkpoint_id, lambda s: s.barrier_received(self.actions, channel, barrier))
        # else: a late barrier of a checkpoint already taken, aborted or superseded

    def _older_event(self, checkpoint_id: int, event: Callable[[BarrierState], BarrierState]) -> None:
        nxt = event(self.older[checkpoint_id])
        if nxt.checkpoint_id is None:
            del self.older[checkpoint_id]
        else:
            self.older[checkpoint_id] = nxt

    def on_trigger(self, barrier: CheckpointBarrier) -> None:
        """A subtask without input channels (a source) takes the coordinator's checkpoint at once."""
        if self._newer(barrier):
            self._first_state(barrier).trigger(self.actions)

    def on_timer(self, now_ms: int) -> None:
        self.state = self.state.timer(self.actions, now_ms)

    def on_switch_to_unaligned(self, checkpoint_id: int) -> None:
        """The coordinator's ``checkpoint.switch_to_unaligned``: obeyed now, or on the first barrier."""
        self.switched.add(checkpoint_id)
        if checkpoint_id == self.state.checkpoint_id:
            self.state = self.state.switch_to_unaligned(self.actions)

    def on_abort(self, checkpoint_id: int, reason: str) -> None:
        self.latest_checkpoint_id = max(self.latest_checkpoint_id, checkpoint_id)  # never start an aborted one
        if checkpoint_id == self.state.checkpoint_id:
            self.state = self.state.abandon(self.actions, reason)
        elif checkpoint_id in self.older:
            self.older.pop(checkpoint_id).abandon(self.actions, reason)

    def on_channel_ended(self, channel: int) -> None:
        for cid in sorted(self.older):
            self._older_event(cid, lambda s: s.channel_ended(self.actions, channel))
        self.state = self.state.channel_ended(self.actions, channel)

    def deadline(self) -> int | None:
        return self.state.deadline()
