"""The subtask's barrier handler: it holds the current barrier state (``spark_plugin.task.barrier_states``, one
small class per state), feeds it its events and is the only one that changes the current checkpoint; with
concurrent unaligned checkpoints it also keeps the older ones still collecting their barriers."""

from __future__ import annotations

from collections.abc import Callable

from contract.models import BarrierPolicy
from spark_plugin.network.barrier import CheckpointBarrier
from spark_plugin.task.barrier_states import (
    FIRST_STATE,
    WAITING,
    BarrierActions,
    BarrierState,
    CollectingBarriers,
    CollectingUnaligned,
)


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
