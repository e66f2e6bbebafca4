"""Channel state: the subtask's writer that collects each checkpoint's in-flight buffers, and the reader that decodes
them back. The layout of the blob is ``contract.channel_state``'s.

One writer per subtask, with a recording per pending checkpoint (Flink's ``ChannelStateWriter``: start, add input
data, add output data, finish input, finish output, abort). It is fed by the network layer only: input data by each
input channel's persister, output data by the output partition. A checkpoint's channel state is ready once both of
its sides finished: the input side when every input channel delivered its barrier, the output side when every output
channel sent it. Then it is laid out as one blob with a segment per channel and direction.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from contract.channel_state import FRAME, frame, spans
from contract.models import ChannelSegment, Partitioning
from spark_plugin.network.framing import count_records, decode_records
from spark_plugin.plan.topology import ChannelInfo


@dataclass
class _Segment:
    info: ChannelInfo
    buffers: list[bytes] = field(default_factory=list)
    records: int = 0


@dataclass
class _Recording:
    segments: dict[tuple[str, str], _Segment] = field(default_factory=dict)
    input_done: bool = False
    output_done: bool = False


@dataclass
class ChannelStateResult:
    """A finished checkpoint's channel state: the blob bytes and its segment index."""

    checkpoint_id: int
    data: bytes
    segments: list[ChannelSegment]
    persisted_bytes: int

    @property
    def empty(self) -> bool:
        return not self.segments


class ChannelStateWriter:
    """Collects the persisted buffers of each pending checkpoint of one subtask.

    Data for a checkpoint that was never started, or was aborted, is dropped: a late buffer of an aborted
    checkpoint changes nothing.
    """

    def __init__(self) -> None:
        self._recordings: dict[int, _Recording] = {}

    def start(self, checkpoint_id: int) -> None:
        if checkpoint_id in self._recordings:
            raise RuntimeError(f"channel state of checkpoint {checkpoint_id} is already being written")
        self._recordings[checkpoint_id] = _Recording()

    def add_input_data(self, checkpoint_id: int, info: ChannelInfo, buffer: bytes) -> None:
        """Persist a buffer (or the unprocessed rest of one) received on an input channel before its barrier."""
        self._add(checkpoint_id, info, buffer, None, "input")

    def add_output_data(self, checkpoint_id: int, info: ChannelInfo, buffer: bytes, records: int) -> None:
        """Persist an output buffer that the checkpoint's barrier overtook."""
        self._add(checkpoint_id, info, buffer, records, "output")

    def _add(self, checkpoint_id: int, info: ChannelInfo, buffer: bytes, records: int | None, direction: str) -> None:
        rec = self._recordings.get(checkpoint_id)
        if rec is None or not buffer:
            return
        if info.direction != direction:
            raise ValueError(f"channel {info.name} is an {info.direction} channel, not {direction}")
        key = (direction, info.name)
        seg = rec.segments.get(key)
        if seg is None:
            seg = rec.segments[key] = _Segment(info)
        seg.buffers.append(bytes(buffer))
        seg.records += count_records(buffer) if records is None else records

    def finish_input(self, checkpoint_id: int) -> None:
        rec = self._recordings.get(checkpoint_id)
        if rec is not None:
            rec.input_done = True

    def finish_output(self, checkpoint_id: int) -> None:
        rec = self._recordings.get(checkpoint_id)
        if rec is not None:
            rec.output_done = True

    def abort(self, checkpoint_id: int) -> None:
        """Drop everything collected for the checkpoint; later additions are ignored."""
        self._recordings.pop(checkpoint_id, None)

    def is_recording(self, checkpoint_id: int) -> bool:
        return checkpoint_id in self._recordings

    def done(self, checkpoint_id: int) -> bool:
        rec = self._recordings.get(checkpoint_id)
        return rec is not None and rec.input_done and rec.output_done

    def ready(self) -> list[int]:
        """The checkpoints whose channel state is complete, oldest first."""
        return sorted(cid for cid, rec in self._recordings.items() if rec.input_done and rec.output_done)

    def take(self, checkpoint_id: int) -> ChannelStateResult:
        """Lay the checkpoint's segments out in one blob (inputs then outputs, channels by name) and forget them."""
        rec = self._recordings.pop(checkpoint_id, None)
        if rec is None:
            raise RuntimeError(f"no channel state of checkpoint {checkpoint_id} is being written")
        parts: list[bytes] = []
        segments: list[ChannelSegment] = []
        offset = 0
        payload = 0
        for key in sorted(rec.segments, key=lambda k: (k[0] != "input", k[1])):
            seg = rec.segments[key]
            data = frame(seg.buffers)
            parts.append(data)
            segments.append(
                ChannelSegment(
                    channel=seg.info.name,
                    direction=seg.info.direction,
                    offset=offset,
                    length=len(data),
                    buffer_count=len(seg.buffers),
                    record_count=seg.records,
                    peer_vertex=seg.info.peer_vertex,
                    peer_subtask=seg.info.peer_subtask,
                    partitioning=Partitioning(seg.info.partitioning) if seg.info.partitioning else None,
                )
            )
            offset += len(data)
            payload += len(data) - FRAME.size * len(seg.buffers)
        return ChannelStateResult(checkpoint_id, b"".join(parts), segments, payload)


class ChannelStateReader:
    """Decodes a channel-state blob (or one segment's bytes) back into buffers and records."""

    def __init__(self, blob: bytes) -> None:
        self.blob = blob

    def buffers(self, offset: int = 0, length: int | None = None) -> Iterator[bytes]:
        """The persisted buffers of the byte range ``[offset, offset + length)``, in order."""
        end = len(self.blob) if length is None else offset + length
        found, stop = spans(self.blob, offset, end)
        if stop != end:
            raise ValueError(f"channel state is truncated: the buffer at {stop} passes the segment's end {end}")
        view = memoryview(self.blob)
        for start, stop in found:
            yield bytes(view[start:stop])

    def segment_buffers(self, segment: ChannelSegment | dict) -> list[bytes]:
        seg = segment if isinstance(segment, dict) else segment.model_dump()
        return list(self.buffers(seg["offset"], seg["length"]))

    def segment_records(self, segment: ChannelSegment | dict) -> list:
        out: list = []
        for buf in self.segment_buffers(segment):
            out.extend(decode_records(buf))
        return out
