"""Record writers: serialize records into per-channel buffers and pick the channel by the edge's partitioning."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from contract.keygroups import key_group
from spark_plugin.network.framing import BufferBuilder
from spark_plugin.network.mailbox import Mailbox
from spark_plugin.network.output import OutputChannel


class RecordWriter:
    """Writes the records of one output edge; a full buffer goes to its channel's queue at once.

    Writing never blocks: the subtask loop stops taking input while an output channel is unavailable, and the
    records of the record in hand may overdraw the queue (Flink's overdraft buffers) so a barrier never waits.
    A channel's buffers are cut at the size its receiver announced (buffer debloating), at most ``buffer_size``.
    """

    def __init__(
        self,
        channels: list[OutputChannel],
        partitioning: str,
        key_fn: Callable[[Any], Any] | None,
        max_parallelism: int,
        buffer_size: int,
        mailbox: Mailbox,
        start: int = 0,
    ) -> None:
        self.channels = channels
        self.builders = [BufferBuilder(buffer_size) for _ in channels]
        for ch, builder in zip(channels, self.builders, strict=True):
            ch.on_buffer_size = partial(_resize, builder, buffer_size)
        self.mailbox = mailbox
        self.bytes_out = 0
        self.partitioning = partitioning
        self.key_fn = key_fn
        self.max_parallelism = max_parallelism
        n = len(channels)
        builders = self.builders
        flush = self._flush

        if partitioning == "forward" or n == 1:

            def emit(record: Any) -> None:
                if builders[0].add(record):
                    flush(0)

        elif partitioning == "rebalance":
            state = [start % n]

            def emit(record: Any) -> None:
                i = state[0]
                state[0] = (i + 1) % n
                if builders[i].add(record):
                    flush(i)

        elif partitioning == "hash":
            assert key_fn is not None
            maxp = max_parallelism

            def emit(record: Any) -> None:
                i = key_group(key_fn(record), maxp) * n // maxp
                if builders[i].add(record):
                    flush(i)

        elif partitioning == "broadcast":

            def emit(record: Any) -> None:
                for i in range(n):
                    if builders[i].add(record):
                        flush(i)

        else:
            raise ValueError(f"unknown partitioning {partitioning!r}")
        self.emit: Callable[[Any], None] = emit

    def channel_of(self, record: Any) -> int | None:
        """The channel (position in this edge) a hash edge sends ``record`` to; None for other partitionings."""
        if self.partitioning != "hash" or self.key_fn is None:
            return None
        return key_group(self.key_fn(record), self.max_parallelism) * len(self.channels) // self.max_parallelism

    def broadcast(self, element: Any) -> None:
        """Append ``element`` (a watermark or status marker) to every channel's buffer, whatever the partitioning:
        in band, behind every record written before it."""
        for i, b in enumerate(self.builders):
            if b.add(element):
                self._flush(i)

    def _flush(self, i: int) -> None:
        b = self.builders[i]
        records = b.records
        data = b.finish()
        self.bytes_out += len(data)
        with self.mailbox.lock:
            self.channels[i].add_buffer(data, records)

    def flush_all(self) -> None:
        """Send every partly filled buffer (before a barrier, at the end, after restored records)."""
        for i, b in enumerate(self.builders):
            if b.records:
                self._flush(i)

    def flush_sendable(self) -> None:
        """Send the partly filled buffers of the channels that would send them at once (on the flush interval and
        when idle): on a channel without credit the buffer keeps filling instead of waiting in the queue."""
        for i, b in enumerate(self.builders):
            if b.records and self.channels[i].can_send():
                self._flush(i)


def _resize(builder: BufferBuilder, most: int, size: int) -> None:
    """Cut the builder's buffers at ``size`` from its next record on (never above the configured ``most``)."""
    builder.capacity = min(most, size)


def fan_out(writers: list[RecordWriter]) -> Callable[[Any], None]:
    """The emit function of a chain's last operator: one writer, or every writer of several edges."""
    if not writers:
        return lambda record: None
    if len(writers) == 1:
        return writers[0].emit
    emits = [w.emit for w in writers]

    def emit(record: Any) -> None:
        for e in emits:
            e(record)

    return emit
