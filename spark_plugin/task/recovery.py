"""A restored subtask's recovery as it goes: the channel state it queued to replay, how much of it it replayed, and
when its replay finished (the ``recovery`` of its live metrics, ``contract.models.SubtaskRecovery``).

What it queued is counted once, after the restore and before the loop: the recovered buffers in the input channels'
queues and the buffers in the output channels' queues (nothing else is queued yet). Replayed input is what the loop
took of it; replayed output is what each output channel sent of its queue, whose recovered buffers go out first.
The replay is through when the gate's recovery order is over (its recovered input taken, every upstream channel's
``RECOVERY_END`` received), the last recovered buffer taken is processed, and every recovered output buffer was sent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spark_plugin.network.channel_items import RecoveredBuffer

if TYPE_CHECKING:
    from spark_plugin.network.input import InputGate
    from spark_plugin.network.output import OutputChannel
    from spark_plugin.network.partition import OutputPartition


class RecoveryProgress:
    """Counted by the subtask loop; read by the live metrics' samples (on the loop too)."""

    def __init__(
        self,
        checkpoint_id: int | None,
        started_at: int,
        restore_ms: int,
        input_bytes: int,
        input_buffers: int,
        outputs: list[tuple[OutputChannel, int]],
        output_buffers: int,
    ) -> None:
        self.checkpoint_id = checkpoint_id
        self.started_at = started_at
        self.restore_ms = restore_ms
        self.input_bytes = input_bytes
        self.buffers = input_buffers + output_buffers
        self.outputs = [(ch, n) for ch, n in outputs if n > 0]
        """Each output channel with recovered bytes queued, and how many."""
        self.replayed_input = 0
        """Recovered input bytes the loop took."""
        self.loop_started_at: int | None = None
        self.finished_at: int | None = None

    @classmethod
    def after_restore(
        cls, gate: InputGate, partition: OutputPartition, checkpoint_id: int | None, started_at: int, restore_ms: int
    ) -> RecoveryProgress:
        """What a subtask, just restored and not yet running, queued to replay in its ``gate`` and ``partition``."""
        with gate.mailbox.lock:
            inputs = [len(item.data) for ch in gate.channels for item in ch.items if type(item) is RecoveredBuffer]
            outputs = [(ch, ch.queued_bytes()) for ch in partition.channels]
            output_buffers = sum(ch.buffers for ch in partition.channels)
        return cls(checkpoint_id, started_at, restore_ms, sum(inputs), len(inputs), outputs, output_buffers)

    @property
    def restored_bytes(self) -> int:
        return self.input_bytes + sum(n for _, n in self.outputs)

    def replayed_bytes(self) -> int:
        return self.replayed_input + sum(min(ch.sent_bytes, n) for ch, n in self.outputs)

    def check_finished(self, gate_recovering: bool, recovered_in_hand: bool, now: int) -> bool:
        """Whether the replay finished just now (it is then stamped with ``now``); False before and after."""
        if self.finished_at is not None or gate_recovering or recovered_in_hand:
            return False
        if any(ch.sent_bytes < n for ch, n in self.outputs):
            return False
        self.finished_at = now
        return True

    def sample(self) -> dict[str, Any]:
        return {
            "restored_checkpoint_id": self.checkpoint_id,
            "restored_bytes": self.restored_bytes,
            "restored_buffers": self.buffers,
            "replayed_bytes": self.replayed_bytes(),
            "replay_finished_at": self.finished_at,
            "restore_ms": self.restore_ms,
            "started_at": self.started_at,
            "loop_started_at": self.loop_started_at,
        }
