"""What the network layer hands in-flight buffers to: the channel-state writer's interface, and the input side's
persister (Flink's ``ChannelStatePersister``), through which an input channel persists its own pre-barrier buffers.

The writer itself is the subtask's (``spark_plugin.task.channel_state``); the network layer only calls it: input
channels through their :class:`ChannelStatePersister`, output channels through their partition.
"""

from __future__ import annotations

from typing import Protocol

from spark_plugin.plan.topology import ChannelInfo


class ChannelStateWriting(Protocol):
    """The calls the network layer makes on the subtask's channel-state writer (one writer per subtask)."""

    def add_input_data(self, checkpoint_id: int, info: ChannelInfo, buffer: bytes) -> None: ...

    def add_output_data(self, checkpoint_id: int, info: ChannelInfo, buffer: bytes, records: int) -> None: ...

    def finish_output(self, checkpoint_id: int) -> None: ...


class ChannelStatePersister:
    """Persists what one input channel hands to its subtask between the start of a checkpoint and that checkpoint's
    barrier on this channel: the unread rest of the buffer in hand when the checkpoint started, every buffer taken
    from the channel after that, and the buffers a priority barrier overtook in the channel's queue.

    Several checkpoints can be persisting at once (each until its own barrier arrives).
    """

    def __init__(self, info: ChannelInfo, writer: ChannelStateWriting | None = None) -> None:
        self.info = info
        self.writer = writer
        self.checkpoints: list[int] = []

    @property
    def persisting(self) -> bool:
        return bool(self.checkpoints)

    def start(self, checkpoint_id: int, in_hand: bytes | None) -> None:
        """Persist for ``checkpoint_id`` from now on; ``in_hand`` is the unread rest of this channel's buffer that
        the subtask holds (the barrier overtook it), if any."""
        if checkpoint_id in self.checkpoints or self.writer is None:
            return
        self.checkpoints.append(checkpoint_id)
        if in_hand:
            self.writer.add_input_data(checkpoint_id, self.info, in_hand)

    def maybe_persist(self, buffer: bytes) -> None:
        """A buffer of this channel is handed to the subtask: persisted for every checkpoint still waiting for its
        barrier here."""
        for checkpoint_id in self.checkpoints:
            self.writer.add_input_data(checkpoint_id, self.info, buffer)  # type: ignore[union-attr]

    def stop(self, checkpoint_id: int, overtaken: list[bytes]) -> None:
        """The barrier of ``checkpoint_id`` arrived on this channel; ``overtaken`` are the buffers queued before it
        that the subtask has not taken yet (a priority barrier jumped them): persisted, then persisting ends."""
        if checkpoint_id not in self.checkpoints:
            return
        for buffer in overtaken:
            self.writer.add_input_data(checkpoint_id, self.info, buffer)  # type: ignore[union-attr]
        self.checkpoints.remove(checkpoint_id)

    def abort(self, checkpoint_id: int) -> None:
        if checkpoint_id in self.checkpoints:
            self.checkpoints.remove(checkpoint_id)
