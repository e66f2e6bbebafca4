"""The channel-state blob format, defined once for the runtime's writer and reader and the coordinator's preview.

A subtask persists the in-flight buffers of a checkpoint into one blob, laid out as::

    blob     = segment*           one segment per channel and direction, at the offset its ChannelSegment names
    segment  = frame(buffer)*     the channel's buffers, in the order they travelled
    buffer   = frame(record)*     the exact bytes that travelled on the channel (or the unread rest of them)
    record   = pickle bytes       one record, pickled once when it was written into its buffer
    frame(x) = u32 little-endian length of x, then x

Both levels use the same frame, so the unprocessed rest of a buffer is itself a valid buffer, and a segment can be
read without unpickling anything (:func:`spans`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

FRAME = struct.Struct("<I")
"""The length prefix of every frame."""

MAX_FRAME = 2**32 - 1


def frame(parts: Iterable[bytes | memoryview]) -> bytes:
    """Frame each part (a buffer of a segment, or a record of a buffer) and join them."""
    out: list[bytes | memoryview] = []
    for part in parts:
        out.append(FRAME.pack(len(part)))
        out.append(part)
    return b"".join(out)


def spans(data: bytes | memoryview, start: int = 0, end: int | None = None) -> tuple[list[tuple[int, int]], int]:
    """The ``(start, end)`` of each whole frame's payload in ``data[start:end]``, and where the whole frames end.

    The second value equals ``end`` when ``data[start:end]`` is whole frames only; it is less when the last frame
    is cut off (its length passes ``end``) or fewer than four bytes are left.
    """
    view = memoryview(data)
    end = len(view) if end is None else end
    out: list[tuple[int, int]] = []
    pos = start
    while pos + FRAME.size <= end:
        (n,) = FRAME.unpack_from(view, pos)
        payload = pos + FRAME.size
        if payload + n > end:
            break
        out.append((payload, payload + n))
        pos = payload + n
    return out, pos


def count_frames(data: bytes | memoryview) -> int:
    """How many frames ``data`` holds (records of a buffer, without unpickling them); refuses broken framing.

    It runs for every input buffer an unaligned checkpoint persists, on the subtask's thread, so it only steps from
    length to length: no list of spans, no payload bounds but the last."""
    view = memoryview(data)
    end = len(view)
    unpack = FRAME.unpack_from
    step = FRAME.size
    pos = count = 0
    while pos + step <= end:
        pos += step + unpack(view, pos)[0]
        count += 1
    if pos != end:
        whole = _whole_frames_end(view)
        raise ValueError(f"{end} bytes do not end on a frame boundary (the whole frames end at {whole})")
    return count


def _whole_frames_end(view: memoryview) -> int:
    return spans(view)[1]
