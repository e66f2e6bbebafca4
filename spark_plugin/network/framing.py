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
from contract.record_codec import decode, encode

_pack = FRAME.pack
_unpack_from = FRAME.unpack_from
_FRAME_SIZE = FRAME.size


class BufferBuilder:
    """Appends records to one buffer until it reaches its size; ``finish`` returns the bytes."""

    __slots__ = ("_parts", "size", "records", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._parts: list[bytes] = []
        self.size = 0
        self.records = 0

    def add(self, record: Any) -> bool:
        """Append one record; return True when the buffer is full and should be finished.

        A record larger than the capacity still goes into a buffer of its own (buffers hold whole records).
        """
        data = encode(record)
        self._parts.append(_pack(len(data)))
        self._parts.append(data)
        self.size += _FRAME_SIZE + len(data)
        self.records += 1
        return self.size >= self.capacity

    def __len__(self) -> int:
        return self.records

    def finish(self) -> bytes:
        """Return the buffer's bytes and reset the builder."""
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
