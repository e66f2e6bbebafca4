"""Channel state: the writer that collects a checkpoint's in-flight buffers and the reader that decodes them.

One blob per subtask and checkpoint holds every persisted buffer of all its channels. Inside the blob, each
channel's buffers are contiguous (one :class:`~client.models.ChannelSegment` per channel and direction, in the
order they travelled) and each buffer is stored as ``[u32 length][the exact bytes that travelled]``, so a reader
gets back the very buffers — or, for a partly processed buffer, the unprocessed byte range of it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

from spark_plugin.framing import count_records, decode_records

_LEN = struct.Struct("<I")


@dataclass
class ChannelInfo:
    """What a channel-state segment says about its channel."""

    name: str
    direction: str  # "input" | "output"
    peer_vertex: str | None = None
    peer_subtask: int | None = None
    partitioning: str | None = None


@dataclass
class _Segment:
    info: ChannelInfo
    buffers: list[bytes] = field(default_factory=list)
    records: int = 0


@dataclass
class ChannelStateResult:
    """A finished checkpoint's channel state: the blob bytes and its segment index (ChannelSegment dicts)."""

    checkpoint_id: int
    data: bytes
    segments: list[dict]
    persisted_bytes: int

    @property
    def empty(self) -> bool:
        return not self.segments


class ChannelStateWriter:
    """Collects the persisted buffers of one checkpoint: start, add input/output data, finish, or abort.

    The network layer only hands buffers to it. Input and output sides finish separately (the input side when
    every channel delivered its barrier, the output side when every output barrier left its queue); the result
    is ready when both have.
    """

    def __init__(self) -> None:
        self.checkpoint_id: int | None = None
        self._segments: dict[tuple[str, str], _Segment] = {}
        self._input_done = False
        self._output_done = False
        self.aborted = False

    def start(self, checkpoint_id: int) -> None:
        if self.checkpoint_id is not None:
            raise RuntimeError(f"channel state writer already started for checkpoint {self.checkpoint_id}")
        self.checkpoint_id = checkpoint_id

    def _segment(self, info: ChannelInfo) -> _Segment:
        key = (info.direction, info.name)
        seg = self._segments.get(key)
        if seg is None:
            seg = self._segments[key] = _Segment(info)
        return seg

    def add_input_data(self, info: ChannelInfo, buffer: bytes, records: int | None = None) -> None:
        """Persist a buffer (or the unprocessed rest of one) received on an input channel before its barrier."""
        self._add(info, buffer, records, "input")

    def add_output_data(self, info: ChannelInfo, buffer: bytes, records: int | None = None) -> None:
        """Persist an output buffer that the barrier overtook."""
        self._add(info, buffer, records, "output")

    def _add(self, info: ChannelInfo, buffer: bytes, records: int | None, direction: str) -> None:
        if self.aborted or not buffer:
            return
        if info.direction != direction:
            raise ValueError(f"channel {info.name} is an {info.direction} channel, not {direction}")
        seg = self._segment(info)
        seg.buffers.append(bytes(buffer))
        seg.records += count_records(buffer) if records is None else records

    def finish_input(self) -> None:
        self._input_done = True

    def finish_output(self) -> None:
        self._output_done = True

    @property
    def done(self) -> bool:
        return self._input_done and self._output_done and not self.aborted

    def abort(self) -> None:
        """Drop everything collected; later additions are ignored."""
        self.aborted = True
        self._segments.clear()

    def result(self) -> ChannelStateResult:
        """Lay the segments out in one blob: inputs then outputs, channels by name."""
        if self.checkpoint_id is None:
            raise RuntimeError("channel state writer was never started")
        parts: list[bytes] = []
        segments: list[dict] = []
        offset = 0
        payload = 0
        for key in sorted(self._segments, key=lambda k: (k[0] != "input", k[1])):
            seg = self._segments[key]
            start = offset
            for buf in seg.buffers:
                parts.append(_LEN.pack(len(buf)))
                parts.append(buf)
                offset += _LEN.size + len(buf)
                payload += len(buf)
            segments.append(
                {
                    "channel": seg.info.name,
                    "direction": seg.info.direction,
                    "offset": start,
                    "length": offset - start,
                    "buffer_count": len(seg.buffers),
                    "record_count": seg.records,
                    "peer_vertex": seg.info.peer_vertex,
                    "peer_subtask": seg.info.peer_subtask,
                    "partitioning": seg.info.partitioning,
                }
            )
        return ChannelStateResult(self.checkpoint_id, b"".join(parts), segments, payload)


class ChannelStateReader:
    """Decodes a channel-state blob (or one segment's bytes) back into buffers and records."""

    def __init__(self, blob: bytes) -> None:
        self.blob = blob

    def buffers(self, offset: int = 0, length: int | None = None) -> Iterator[bytes]:
        """The persisted buffers of the byte range ``[offset, offset + length)``, in order."""
        end = len(self.blob) if length is None else offset + length
        view = memoryview(self.blob)
        pos = offset
        while pos < end:
            (n,) = _LEN.unpack_from(view, pos)
            pos += _LEN.size
            if pos + n > end:
                raise ValueError(f"channel state is truncated: a buffer of {n} bytes at {pos} passes {end}")
            yield bytes(view[pos : pos + n])
            pos += n

    def segment_buffers(self, segment: dict) -> list[bytes]:
        return list(self.buffers(segment["offset"], segment["length"]))

    def segment_records(self, segment: dict) -> list:
        out: list = []
        for buf in self.buffers(segment["offset"], segment["length"]):
            out.extend(decode_records(buf))
        return out
