"""Record writers: serialize records into per-channel buffers and pick the channel by the edge's partitioning."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from functools import partial
from typing import Any

from contract.keygroups import key_group, operator_index
from contract.models import Partitioning
from spark_plugin.network.elements import Regenerated
from spark_plugin.network.framing import BufferBuilder
from spark_plugin.network.mailbox import Mailbox
from spark_plugin.network.output import OutputChannel

Emit = Callable[[Any], None]
Flush = Callable[[int], None]


class RecordWriter:
    """Writes the records of one output edge; a full buffer goes to its channel's queue at once.

    Writing never blocks: the subtask loop stops taking input while an output channel is unavailable, and the
    records of the record in hand may overdraw the queue (Flink's overdraft buffers) so a barrier never waits.
    A channel's buffers are cut at the size its receiver announced (buffer debloating), at most ``buffer_size``.
    """

    def __init__(
        self,
        channels: list[OutputChannel],
        partitioning: Partitioning | str,
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
        self.finished = [0] * len(channels)
        """Buffers finished per channel (handed to its queue), for a regenerating subtask's log."""
        self.counts: list[int] | None = None
        """Records sent per key group of the target (a regenerating subtask's hash edge; ``count_per_key_group``)."""
        self.out_groups: array[int] | None = None
        self.out_buffers: array[int] | None = None
        """Per record written since ``track_outputs``: its key group, and the index of the buffer it went into
        (``finished`` of its channel then)."""
        try:
            self.partitioning = Partitioning(partitioning)
        except ValueError:
            raise ValueError(
                f"unknown partitioning {partitioning!r}; one of {', '.join(p.value for p in Partitioning)}"
            ) from None
        self.key_fn = key_fn
        self.max_parallelism = max_parallelism
        make = _forward if len(channels) == 1 else EMITTERS[self.partitioning]
        if make is _by_key_group and splits(key_fn):
            make = _by_target_subtask
        self.emit: Emit = make(self.builders, self._flush, key_fn, max_parallelism, start)

    def channel_of(self, record: Any) -> int | None:
        """The channel (position in this edge) a hash edge sends ``record`` to; None for other partitionings."""
        if self.partitioning is not Partitioning.hash or self.key_fn is None:
            return None
        if splits(self.key_fn):  # a record of rows with several keys: one channel only if all its rows go there
            n, maxp = len(self.channels), self.max_parallelism
            parts = self.key_fn.split_rows(record, maxp, lambda g: operator_index(g, maxp, n))
            return parts[0][0] if len(parts) == 1 else None
        return key_group(self.key_fn(record), self.max_parallelism) * len(self.channels) // self.max_parallelism

    def count_per_key_group(self) -> list[int]:
        """Count the records sent per key group from now on (a regenerating subtask's hash edge); returns the
        counts, one per key group, which the writer updates in place."""
        if self.partitioning is not Partitioning.hash or self.key_fn is None or splits(self.key_fn):
            raise ValueError("only a hash edge of records counts per key group")
        self.counts = [0] * self.max_parallelism
        self._counting()
        return self.counts

    def track_outputs(self) -> tuple[array[int], array[int]]:
        """Record, for every record written from now on, its key group and the buffer it went into (a regenerating
        subtask's log, ``spark_plugin.task.regeneration``); returns the two arrays, which the writer appends to."""
        if self.out_groups is None or self.out_buffers is None:
            if self.counts is None:
                self.count_per_key_group()
            self.out_groups, self.out_buffers = array("H"), array("q")
            self._counting()
        return self.out_groups, self.out_buffers

    def _counting(self) -> None:
        assert self.counts is not None
        self.emit = _by_key_group_counting(self.builders, self._flush, self.key_fn, self.max_parallelism, self.counts,
                                           self.finished, self.out_groups, self.out_buffers)

    def regenerating_emit(self, producer: int, counts: list[int]) -> Emit:
        """The emit function of a replay of logged inputs: each record is sent as :class:`Regenerated` with the
        count ``counts`` (the old producer's, per key group, updated in place) gives it, to the channel its key group
        goes to now."""
        builders, flush, key_fn = self.builders, self._flush, self.key_fn
        assert key_fn is not None
        n, maxp = len(builders), self.max_parallelism

        def emit(record: Any) -> None:
            g = key_group(key_fn(record), maxp)
            counts[g] += 1
            i = g * n // maxp
            if builders[i].add(Regenerated(producer, counts[g], record)):
                flush(i)

        return emit

    def broadcast(self, element: Any) -> None:
        """Append ``element`` (a watermark or status marker) to every channel's buffer, whatever the partitioning:
        in band, behind every record written before it."""
        for i, b in enumerate(self.builders):
            if b.add(element):
                self._flush(i)

    def _flush(self, i: int) -> None:
        b = self.builders[i]
        if b.full:  # the buffers a batch cut across buffers filled first
            full, b.full = b.full, []
            for data, records in full:
                self.bytes_out += len(data)
                self.finished[i] += 1
                with self.mailbox.lock:
                    self.channels[i].add_buffer(data, records)
        if not b.records:
            return
        records = b.records
        data = b.finish()
        self.bytes_out += len(data)
        self.finished[i] += 1
        with self.mailbox.lock:
            self.channels[i].add_buffer(data, records)

    def flush_all(self) -> None:
        """Send every partly filled buffer (before a barrier, at the end, after restored records)."""
        for i, b in enumerate(self.builders):
            if b.records or b.full:
                self._flush(i)

    def flush_sendable(self) -> None:
        """Send the partly filled buffers of the channels that would send them at once (on the flush interval and
        when idle): on a channel without credit the buffer keeps filling instead of waiting in the queue."""
        for i, b in enumerate(self.builders):
            if b.records and self.channels[i].can_send():
                self._flush(i)


# ====================================================================================== emitters, by partitioning
# Each makes the function that writes one record: the hot path, one closure per edge with everything bound.


def _forward(builders: list[BufferBuilder], flush: Flush, key_fn: Any, max_parallelism: int, start: int) -> Emit:
    """Every record to the one channel (forward, or any edge with a single channel)."""

    def emit(record: Any) -> None:
        if builders[0].add(record):
            flush(0)

    return emit


def _round_robin(builders: list[BufferBuilder], flush: Flush, key_fn: Any, max_parallelism: int, start: int) -> Emit:
    """Records in turn to each channel, starting at ``start`` (rebalance)."""
    n = len(builders)
    state = [start % n]

    def emit(record: Any) -> None:
        i = state[0]
        state[0] = (i + 1) % n
        if builders[i].add(record):
            flush(i)

    return emit


def _by_key_group(builders: list[BufferBuilder], flush: Flush, key_fn: Any, max_parallelism: int, start: int) -> Emit:
    """Each record to the channel whose subtask owns its key's key group (hash)."""
    assert key_fn is not None
    n = len(builders)
    maxp = max_parallelism

    def emit(record: Any) -> None:
        i = key_group(key_fn(record), maxp) * n // maxp
        if builders[i].add(record):
            flush(i)

    return emit


def _by_key_group_counting(
    builders: list[BufferBuilder], flush: Flush, key_fn: Any, max_parallelism: int, counts: list[int],
    finished: list[int], groups: array[int] | None, buffers: array[int] | None,
) -> Emit:
    """:func:`_by_key_group`, counting the records of each key group and, with ``groups`` and ``buffers``, noting
    each record's key group and the buffer it goes into (a regenerating subtask's hash edge)."""
    n = len(builders)
    maxp = max_parallelism
    if groups is None or buffers is None:

        def counted(record: Any) -> None:
            g = key_group(key_fn(record), maxp)
            counts[g] += 1
            i = g * n // maxp
            if builders[i].add(record):
                flush(i)

        return counted
    note_group, note_buffer = groups.append, buffers.append

    def noted(record: Any) -> None:
        g = key_group(key_fn(record), maxp)
        counts[g] += 1
        i = g * n // maxp
        note_group(g)
        note_buffer(finished[i])
        if builders[i].add(record):
            flush(i)

    return noted


def splits(key_fn: Any) -> bool:
    """Whether a hash edge's key selector cuts a record of many keys (a keyed batch) into the parts of each owner:
    ``key_fn.split_rows(record, max_parallelism, owner) -> [(owner(key group), part), ...]``."""
    return callable(getattr(key_fn, "split_rows", None))


def _by_target_subtask(
    builders: list[BufferBuilder], flush: Flush, key_fn: Any, max_parallelism: int, start: int
) -> Emit:
    """Each record (of rows with many keys) cut into one part per target subtask, the rows of the key groups it
    owns, assigned as :func:`_by_key_group` assigns a record's key group (hash, for keyed batches)."""
    n = len(builders)
    maxp = max_parallelism
    split = key_fn.split_rows

    def owner(g: int) -> int:
        return operator_index(g, maxp, n)

    def emit(record: Any) -> None:
        for i, part in split(record, maxp, owner):
            if builders[i].add(part):
                flush(i)

    return emit


def _to_every_channel(
    builders: list[BufferBuilder], flush: Flush, key_fn: Any, max_parallelism: int, start: int
) -> Emit:
    """Every record to every channel (broadcast)."""
    n = len(builders)

    def emit(record: Any) -> None:
        for i in range(n):
            if builders[i].add(record):
                flush(i)

    return emit


EMITTERS: dict[Partitioning, Callable[[list[BufferBuilder], Flush, Any, int, int], Emit]] = {
    Partitioning.forward: _forward,
    Partitioning.rebalance: _round_robin,
    Partitioning.hash: _by_key_group,
    Partitioning.broadcast: _to_every_channel,
}
"""The emitter of each partitioning: what a record writer calls per record."""


def _resize(builder: BufferBuilder, most: int, size: int) -> None:
    """Cut the builder's buffers at ``size`` from its next record on (never above the configured ``most``)."""
    builder.capacity = min(most, size)


def fan_out(writers: list[RecordWriter]) -> Emit:
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
