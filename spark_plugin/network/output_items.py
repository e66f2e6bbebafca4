"""What an output channel's queue holds, as named types: finished buffers, barriers in band, priority barriers at
the head and the end markers; each becomes one message on the wire.

The channel tells them apart by type (``type(item) is OutBuffer``): one identity check, as cheap as the one-letter
tags these replace. They are slotted dataclasses rather than NamedTuples: a buffer item is built for every buffer
sent, and a slotted class is built in half the time of a NamedTuple.
"""

from __future__ import annotations

from dataclasses import dataclass

from spark_plugin.network.barrier import CheckpointBarrier


@dataclass(slots=True)
class OutBuffer:
    """A finished buffer of ``records`` records: it goes out only against a credit (a ``BUFFER`` message)."""

    data: bytes
    records: int


@dataclass(slots=True)
class OutBarrier:
    """A barrier in band (an ``EVENT`` message, needs no credit): it goes out behind the buffers queued before it."""

    barrier: CheckpointBarrier


@dataclass(slots=True)
class OutPriorityBarrier:
    """A priority barrier (a ``PRIORITY`` message, needs no credit): at the head of the queue, behind only the
    priority barriers queued before it; the buffers behind it are the ones it overtook."""

    barrier: CheckpointBarrier


@dataclass(slots=True)
class OutEnd:
    """The end of the subtask's output: nothing follows on this channel (an ``END`` message)."""


@dataclass(slots=True)
class OutRecoveryEnd:
    """The restored output channel state queued before it was all sent; new output follows (a ``RECOVERY_END``
    message)."""


END = OutEnd()
RECOVERY_END = OutRecoveryEnd()

OutItem = OutBuffer | OutBarrier | OutPriorityBarrier | OutEnd | OutRecoveryEnd
