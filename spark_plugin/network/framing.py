"""Records inside buffers: a buffer is framed records (``contract.channel_state``), built and read on the hot path.

Records are encoded once each, when they are appended (pickled, or as Arrow IPC for the batches of batch streams:
``contract.record_codec``), and a whole buffer travels and is persisted as it is:
channel state stores the exact bytes that were sent and never re-serializes. A reader decodes a buffer lazily, one
record at a time, and can hand out the byte range of the records it has not processed yet (itself a valid buffer).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from contract.channel_state import FRAME, count_frames, frame
from contract.record_codec import ARROW_FIRST_BYTE, decode, encode, rows_of, slice_rows

_pack = FRAME.pack
_unpack_from = FRAME.unpack_from
_FRAME_SIZE = FRAME.size


MIN_SLICE_ROWS = 8192
"""A batch is never cut into slices of fewer rows than this (unless it has fewer), however small the buffers are:
each slice pays a batch's fixed costs again (its schema and IPC framing, a buffer's trip, and each operator's call:
Arrow's ``group_by`` alone takes some 0.12 ms). The keyed window count of ``overtake bench batches`` in threads
(4,000,000 events, 24-byte rows, 32 KiB buffers) took 0.99 s uncut, 4.4 s with slices of 256 rows (about a buffer),
3.2 s with 2,048 and 1.2 s with 8,192; on Spark the batch path with 8,192 moved more than uncut."""


class BufferBuilder:
    """Appends records to one buffer until it reaches its size; ``finish`` returns the bytes.

    **A batch larger than the room left is cut across buffers.** A batch record (Arrow: a ``pyarrow.RecordBatch`` or
    a keyed batch) that does not fit is sliced by rows (zero-copy), each slice a whole Arrow record of its own sized
    to the room left in the buffer it goes into, so buffers stay about ``capacity`` bytes, a barrier can overtake
    the buffers of a batch's later rows, and channel state stays whole Arrow messages that pyarrow reads. The
    buffers a batch fills before the last one wait in ``full`` (the writer sends them first, in order). Slices have
    at least :data:`MIN_SLICE_ROWS` rows, so a batch of narrow rows is cut into slices of several buffers' bytes. Any other record larger than the capacity still goes into a buffer of its
    own (buffers hold whole records).
    """

    __slots__ = ("_parts", "size", "records", "capacity", "full")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._parts: list[bytes] = []
        self.size = 0
        self.records = 0
        self.full: list[tuple[bytes, int]] = []
        """Buffers a cut batch filled, in order, with their record counts: sent before the one being built."""

    def add(self, record: Any) -> bool:
        """Append one record; return True when the buffer is full and should be finished (and ``full`` sent)."""
        data = encode(record)
        if len(data) > self.capacity - self.size and data[0] == ARROW_FIRST_BYTE:
            return self._add_cut(record, data)
        self._parts.append(_pack(len(data)))
        self._parts.append(data)
        self.size += _FRAME_SIZE + len(data)
        self.records += 1
        return self.size >= self.capacity

    def _append(self, data: bytes) -> None:
        self._parts.append(_pack(len(data)))
        self._parts.append(data)
        self.size += _FRAME_SIZE + len(data)
        self.records += 1

    def _add_cut(self, record: Any, data: bytes) -> bool:
        rows = rows_of(record)
        if rows < 2 * MIN_SLICE_ROWS:
            self._append(data)
            return self.size >= self.capacity
        per_row = len(data) / rows
        start = 0
        while start < rows:
            room = self.capacity - self.size
            if room < per_row * MIN_SLICE_ROWS and self.records:
                n = self.records
                self.full.append((self.finish(), n))
                room = self.capacity
            take = max(MIN_SLICE_ROWS, int(room / per_row))
            if rows - start - take < MIN_SLICE_ROWS:
                take = rows - start  # no runt of a slice at the end
            self._append(encode(slice_rows(record, start, take)) if take < rows else data)
            start += take
        return self.size >= self.capacity or bool(self.full)

    def __len__(self) -> int:
        return self.records

    def finish(self) -> bytes:
        """Return the buffer's bytes (the one being built, not ``full``'s) and reset it."""
        data = b"".join(self._parts)
        self._parts = []
        self.size = 0
        self.records = 0
        return data


def encode_records(records: Iterable[Any]) -> bytes:
    """Frame records into one buffer (no size limit); used for recovered state and by tests."""
    return frame(encode(r) for r in records)


def decode_records(buffer: bytes | memoryview) -> list[Any]:
    """Decode every record of a buffer."""
    return list(BufferReader(buffer))


def count_records(buffer: bytes | memoryview) -> int:
    """Count the records of a buffer without decoding them."""
    return count_frames(buffer)


class BufferReader:
    """Reads the records of one buffer in order; ``rest`` is the byte range not yet read."""

    __slots__ = ("data", "pos", "channel", "records_read")

    def __init__(self, data: bytes | memoryview, channel: int = -1) -> None:
        self.data = data
        self.pos = 0
        self.channel = channel
        self.records_read = 0

    def has_next(self) -> bool:
        return self.pos < len(self.data)

    def next(self) -> Any:
        """Return the next record (raises IndexError at the end)."""
        pos = self.pos
        if pos >= len(self.data):
            raise IndexError("no more records in this buffer")
        (length,) = _unpack_from(self.data, pos)
        start = pos + _FRAME_SIZE
        self.pos = start + length
        self.records_read += 1
        return decode(self.data[start : self.pos])

    def __iter__(self) -> Iterator[Any]:
        while self.pos < len(self.data):
            yield self.next()

    def rest(self) -> bytes:
        """The bytes of the records not read yet: a valid buffer of its own."""
        return bytes(self.data[self.pos :])
