"""What an input channel's queue holds, as named types: buffers, recovered buffers, barrier markers and the end
markers.

The subtask loop and the gate tell them apart by type (``type(item) is Buffer``): one identity check, as cheap as
the one-letter tags these replace. A buffer is one item, never one per record.
"""

from __future__ import annotations

from typing import NamedTuple

from spark_plugin.network.barrier import CheckpointBarrier


class Buffer(NamedTuple):
    """A buffer that arrived on the channel; processing it returns a credit."""

    data: bytes


class RecoveredBuffer(NamedTuple):
    """A buffer of recovered input channel state: processed before anything else, returns no credit."""

    data: bytes


class Barrier(NamedTuple):
    """A barrier in band: it waits its turn behind the buffers ahead of it."""

    barrier: CheckpointBarrier


class PriorityBarrier(NamedTuple):
    """A priority barrier at its arrival position, also announced on the gate: the buffers ahead of it are the ones
    it overtook."""

    barrier: CheckpointBarrier


class HeldBarrier(NamedTuple):
    """A priority barrier the subtask acted on, left where it arrived: its channel is blocked until the snapshot."""

    barrier: CheckpointBarrier


class End(NamedTuple):
    """The upstream subtask ended its output: nothing follows on this channel."""


class RecoveryEnd(NamedTuple):
    """The upstream sent all of its restored output channel state on this channel."""


END = End()
RECOVERY_END = RecoveryEnd()

QueueItem = Buffer | RecoveredBuffer | Barrier | PriorityBarrier | HeldBarrier | End | RecoveryEnd

DATA = (Buffer, RecoveredBuffer)
"""The item types that hold data (``type(item) in DATA``)."""
