"""Records inside buffers: a buffer is framed records (``contract.channel_state``), built and read on the hot path.

Records are encoded once each, when they are appended (pickled, or as Arrow IPC for the batches of batch streams:
``contract.record_codec``), and a whole buffer travels and is persisted as it is:
channel state stores the exact bytes that were sent and never re-serializes. A reader decodes a buffer lazily, one
record at a time, and can hand out the byte range of the records it has not processed yet (itself a valid buffer;
only a batch there that travelled without its schema gets the schema's bytes put back in front of it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from contract.channel_state import FRAME, count_frames, frame
from contract.record_codec import (
    ARROW_FIRST_BYTE,
    SHARED_SCHEMA,
    decode,
    decode_without_schema,
    encode,
    read_schema,
    rows_of,
    schema_length,
    slice_rows,
    with_schema,
)

_pack = FRAME.pack
_unpack_from = FRAME.unpack_from
_FRAME_SIZE = FRAME.size
_SHARED = bytes([SHARED_SCHEMA])


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
    at least :data:`MIN_SLICE_ROWS` rows, so a batch of narrow rows is cut into slices of several buffers' bytes.
    Any other record larger than the capacity still goes into a buffer of its own (buffers hold whole records).

    **A schema per buffer.** An Arrow record whose schema message is the same bytes as the buffer's last whole Arrow
    record's goes without it (first byte ``contract.record_codec.SHARED_SCHEMA``); a buffer's first Arrow record
    always has it, so a buffer reads alone from its start.
    """

    __slots__ = ("_parts", "size", "records", "capacity", "full", "_schema")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._parts: list[bytes | memoryview] = []
        self.size = 0
        self.records = 0
        self.full: list[tuple[bytes, int]] = []
        """Buffers a cut batch filled, in order, with their record counts: sent before the one being built."""
        self._schema: bytes | None = None
        """The schema message of the buffer's last whole Arrow record: a batch of the same schema after it goes
        without its own."""

    def add(self, record: Any) -> bool:
        """Append one record; return True when the buffer is full and should be finished (and ``full`` sent)."""
        data = encode(record)
        if data[0] == ARROW_FIRST_BYTE:
            if len(data) > self.capacity - self.size:
                return self._add_cut(record, data)
            self._append(data)
            return self.size >= self.capacity
        self._parts.append(_pack(len(data)))
        self._parts.append(data)
        self.size += _FRAME_SIZE + len(data)
        self.records += 1
        return self.size >= self.capacity

    def _append(self, data: bytes) -> None:
        """Append an Arrow record: without its schema message when the buffer's last whole one has the same."""
        n = schema_length(data)
        schema = self._schema
        if n and schema is not None and n == len(schema) and data.startswith(schema):
            self._parts += (_pack(1 + len(data) - n), _SHARED, memoryview(data)[n:])
            self.size += _FRAME_SIZE + 1 + len(data) - n
        else:
            self._schema = data[:n] if n else None
            self._parts += (_pack(len(data)), data)
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
        self._schema = None  # every buffer's first Arrow record carries its schema: a buffer reads alone
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
    """Reads the records of one buffer in order; ``rest`` is the byte range not yet read (a batch there written
    without its schema gets it back, so the rest reads alone)."""

    __slots__ = ("data", "pos", "channel", "records_read", "_schema", "_parsed")

    def __init__(self, data: bytes | memoryview, channel: int = -1) -> None:
        self.data = data
        self.pos = 0
        self.channel = channel
        self.records_read = 0
        self._schema: tuple[int, int] | None = None
        """Where the schema message of the last whole Arrow record read lies in ``data``."""
        self._parsed: tuple[tuple[int, int], Any] | None = None
        """That schema parsed, with where it lies (parsed once for the batches that go without it)."""

    def has_next(self) -> bool:
        return self.pos < len(self.data)

    def next(self) -> Any:
        """Return the next record (raises IndexError at the end)."""
        pos = self.pos
        data = self.data
        if pos >= len(data):
            raise IndexError("no more records in this buffer")
        (length,) = _unpack_from(data, pos)
        start = pos + _FRAME_SIZE
        end = self.pos = start + length
        self.records_read += 1
        first = data[start] if length else -1
        if first == ARROW_FIRST_BYTE:
            n = schema_length(data[start:end])
            self._schema = (start, start + n) if n else None
        elif first == SHARED_SCHEMA:
            span = self._schema
            if span is None:
                self._whole(start, end)  # raises: no schema before it
            assert span is not None
            parsed = self._parsed
            if parsed is None or parsed[0] != span:
                parsed = self._parsed = (span, read_schema(memoryview(data)[span[0] : span[1]]))
            return decode_without_schema(memoryview(data)[start:end], parsed[1], data[span[0] : span[1]])
        return decode(data[start:end])

    def _whole(self, start: int, end: int) -> bytes:
        """The whole Arrow record of the batch without its schema at ``data[start:end]``."""
        if self._schema is None:
            raise ValueError("a batch written without its schema follows no Arrow record of its buffer that has one: "
                             "the buffer is corrupt or was cut in the middle")
        s0, s1 = self._schema
        return with_schema(self.data[s0:s1], self.data[start:end])

    def __iter__(self) -> Iterator[Any]:
        while self.pos < len(self.data):
            yield self.next()

    def rest(self) -> bytes:
        """The bytes of the records not read yet: a valid buffer of its own. Where its first Arrow record is a batch
        written without its schema, that one is given the schema again (the later such batches follow it)."""
        data, pos = self.data, self.pos
        if self._schema is None:  # no whole Arrow record read: the first one after ``pos`` has its schema
            return bytes(data[pos:])
        at = pos
        while at + _FRAME_SIZE < len(data):
            (length,) = _unpack_from(data, at)
            start = at + _FRAME_SIZE
            first = data[start] if length else -1
            if first == SHARED_SCHEMA:
                whole = self._whole(start, start + length)
                return b"".join((data[pos:at], _pack(len(whole)), whole, data[start + length :]))
            if first == ARROW_FIRST_BYTE:
                break
            at = start + length
        return bytes(data[pos:])
