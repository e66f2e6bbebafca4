"""The channel-state blob format, defined once for the runtime's writer and reader and the coordinator's preview.

A subtask persists the in-flight buffers of a checkpoint into one blob, laid out as::

    blob     = segment*           one segment per channel and direction, at the offset its ChannelSegment names
    segment  = frame(buffer)*     the channel's buffers, in the order they travelled
    buffer   = frame(record)*     the exact bytes that travelled on the channel (or the unread rest of them)
    record   = encoded bytes      one record, encoded once when it was written into its buffer: a pickle, or an
                                  Arrow IPC stream on a batch edge (``contract.record_codec``)
    frame(x) = u32 little-endian length of x, then x

Both levels use the same frame, so the unprocessed rest of a buffer is itself a valid buffer (on a batch edge, once
its first Arrow record has its schema again: ``BufferReader.rest``), and a segment can be read without unpickling
anything (:func:`spans`).

**Compressed segments.** A segment whose ``ChannelSegment.codec`` is set (``"lz4"``: the LZ4 frame format, or
``"zstd"``) holds each buffer compressed on its own, so a range of whole buffers still reads alone and incremental
channel state can still reference single buffers::

    segment  = frame(packed)*
    packed   = u32 little-endian length of the buffer, then the buffer compressed by the codec

``offset`` and ``length`` count the bytes as they lie in the blob (compressed). The codecs are pyarrow's
(``pyarrow.Codec``), imported only where a compressed segment is written or read. A segment without ``codec``
(every checkpoint written before compression existed) is read as before.
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


CODECS = ("lz4", "zstd")
"""The codecs channel state may be compressed with."""


def check_codec(codec: str | None, what: str = "channel_state_compression") -> str | None:
    """``codec`` if it names a codec of :data:`CODECS` (or is None: uncompressed); otherwise a ValueError that says
    which values work."""
    if codec is None or codec in CODECS:
        return codec
    raise ValueError(f"{what} {codec!r} is not a codec channel state can be compressed with; use one of "
                     f"{', '.join(map(repr, CODECS))}, or None to write it uncompressed")


def _codec(codec: str):  # noqa: ANN202 - pyarrow is optional: its types are not imported at module level
    try:
        import pyarrow as pa
    except ImportError as e:  # pragma: no cover - the runtime's batch extras bring pyarrow
        raise RuntimeError(f"channel state compressed with {codec!r} needs pyarrow; install it (pip install "
                           "'overtake[arrow]')") from e
    check_codec(codec, "codec")
    return pa.Codec(codec)


def pack(codec: str, buffer: bytes | memoryview) -> bytes:
    """One buffer as a compressed segment holds it: its length, then its bytes compressed by ``codec``."""
    return FRAME.pack(len(buffer)) + _codec(codec).compress(buffer, asbytes=True)


def unpack(codec: str, packed: bytes | memoryview, max_size: int | None = None) -> bytes:
    """The buffer :func:`pack` packed; refuses one whose stated length passes ``max_size`` (a reader of untrusted
    bytes bounds what it inflates) or that does not inflate to exactly that length."""
    view = memoryview(packed)
    if len(view) < FRAME.size:
        raise ValueError(f"a compressed buffer of {len(view)} bytes is shorter than its length prefix")
    (size,) = FRAME.unpack_from(view, 0)
    if max_size is not None and size > max_size:
        raise ValueError(f"a compressed buffer inflates to {size} bytes, more than the {max_size} allowed here")
    if size == 0:
        return b""
    out = _codec(codec).decompress(view[FRAME.size:], decompressed_size=size, asbytes=True)
    if len(out) != size:
        raise ValueError(f"a compressed buffer inflated to {len(out)} bytes; its length prefix says {size}")
    return out


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
