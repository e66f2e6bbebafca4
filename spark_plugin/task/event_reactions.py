"""What a subtask does on each coordinator event: a trigger (sources), a switch to unaligned, an abort, a
completion, the job's end; one method per event type, found through one table (``EventReactions.dispatch``).

Events reach the loop through the subtask's ``EventFeed``; the loop hands each one here between two records.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from contract.events import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointTriggered,
    EventPayload,
    JobStatusChanged,
    SwitchToUnaligned,
)
from spark_plugin.network.barrier import CheckpointBarrier
from spark_plugin.task.barriers import BarrierHandler
from spark_plugin.task.chain import OperatorChain
from spark_plugin.task.channel_state import ChannelStateWriter
from spark_plugin.task.checkpoints import CheckpointController
from spark_plugin.task.source_reader import SourceReader
from spark_plugin.task.state_store import StateTargets


class SubtaskLoop(Protocol):
    """What the reactions may see and do of the subtask's loop."""

    ended_output: bool
    halted: str | None

    def end_output(self) -> None: ...


class EventReactions:
    """The subtask's reactions to coordinator events."""

    def __init__(
        self,
        loop: SubtaskLoop,
        has_inputs: bool,
        handler: BarrierHandler,
        checkpoints: CheckpointController,
        writer: ChannelStateWriter,
        chain: OperatorChain,
        reader: SourceReader | None,
        stop_after_checkpoints: int | None = None,
    ) -> None:
        self.loop = loop
        self.has_inputs = has_inputs
        self.handler = handler
        self.checkpoints = checkpoints
        self.writer = writer
        self.chain = chain
        self.reader = reader
        self.stop_after_checkpoints = stop_after_checkpoints
        self.completed_seen = 0
        self._on_event: dict[type, Callable[[Any], None]] = {
            CheckpointTriggered: self.triggered,
            SwitchToUnaligned: self.switch_to_unaligned,
            CheckpointAborted: self.aborted,
            CheckpointCompleted: self.completed,
            JobStatusChanged: self.job_status,
        }

    def dispatch(self, payload: EventPayload) -> None:
        handle = self._on_event.get(type(payload))
        if handle is not None:
            handle(payload)

    def target(self, targets: StateTargets, trigger: CheckpointTriggered) -> None:
        """A trigger's write target, for the ack worker (the event feed's thread); one that takes references makes
        the channel-state writer keep where buffers lie."""
        targets.put(trigger.checkpoint_id, trigger.target)
        if trigger.target is not None and trigger.target.incremental:
            self.writer.references_taken = True

    def triggered(self, trigger: CheckpointTriggered) -> None:
        if trigger.external or (self.has_inputs and not self.loop.ended_output):
            return  # only sources act on triggers; the others wait for barriers
        barrier = CheckpointBarrier.of(trigger)
        if self.reader is not None:
            barrier = self.reader.barrier_for(barrier)
        if self.loop.ended_output:
            # a finished subtask still acknowledges: its final state (and offsets); it has no barrier to send
            barrier = barrier.as_aligned_final()
        self.handler.on_trigger(barrier)

    def switch_to_unaligned(self, switch: SwitchToUnaligned) -> None:
        self.handler.on_switch_to_unaligned(switch.checkpoint_id)
        self.checkpoints.switch_output_barriers(switch.checkpoint_id)

    def aborted(self, abort: CheckpointAborted) -> None:
        cid = abort.checkpoint_id
        reason = abort.reason or "aborted by the coordinator"
        self.checkpoints.aborted_by_coordinator.add(cid)
        if self.reader is not None:
            self.reader.aborted(cid)
        self.handler.on_abort(cid, reason)
        self.checkpoints.aborted(cid, reason)

    def completed(self, completed: CheckpointCompleted) -> None:
        cid = completed.checkpoint_id
        self.writer.completed(cid)
        self.chain.notify_checkpoint_complete(cid)
        if self.reader is not None and self.reader.completed(cid):
            self.loop.end_output()
        self.completed_seen += 1
        if self.stop_after_checkpoints is not None and self.completed_seen >= self.stop_after_checkpoints:
            self.loop.halted = "checkpoint limit"

    def job_status(self, status: JobStatusChanged) -> None:
        if status.ended:  # FINISHED too: a job stopped with a savepoint
            self.loop.halted = f"job {status.status.value.lower()}"
