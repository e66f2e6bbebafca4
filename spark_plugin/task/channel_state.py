"""Channel state: the subtask's writer that collects each checkpoint's in-flight buffers, and the reader that decodes
them back. The layout of the blob is ``contract.channel_state``'s.

One writer per subtask, with a recording per pending checkpoint (Flink's ``ChannelStateWriter``: start, add input
data, add output data, finish input, finish output, abort). It is fed by the network layer only: input data by each
input channel's persister, output data by the output partition. A checkpoint's channel state is ready once both of
its sides finished: the input side when every input channel delivered its barrier, the output side when every output
channel sent it. Then it is laid out as one blob with a segment per channel and direction.

**Incremental channel state.** A buffer's identity is the buffer itself: the network layer hands the writer the
very ``bytes`` object that sits in a channel's queue, so a buffer still queued at the next checkpoint comes back as
the same object. Once a checkpoint's object is written (``written``) and the checkpoint completed (``completed``),
the writer keeps where each of its buffers lies (the object's key, the frame's offset in its channel state) as the
*base*, holding the buffers themselves so that no identity is reused while it is kept. The next checkpoint's
segments then name a buffer found in the base as a part that references that range instead of carrying its bytes
again (``ChannelSegment.parts``). Only the latest completed checkpoint's placements are the base: everything it
names is kept by the coordinator while that checkpoint is retained. A result can always be laid out whole again
(``ChannelStateResult.whole``), for uploads through the coordinator and for a reference the coordinator refuses.

**Compression.** A writer made with a codec (``NetworkConfig.channel_state_compression``) compresses each new buffer
on its own as it lays a checkpoint out (``contract.channel_state.pack``) and names the codec in every segment; a
buffer referenced from the base is not compressed again (the base was laid out by the same writer, with the same
codec). The reader inflates what a segment's codec says, so checkpoints written without one read as before.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from contract.channel_state import FRAME, check_codec, pack, spans, unpack
from contract.models import ChannelSegment, SegmentPart
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


Placement = tuple[bytes, str | None, int, int]
"""Where a persisted buffer's frame lies: ``(buffer, key, offset, length)``; key None: the checkpoint's own object
(offsets count from the start of its channel state)."""


@dataclass
class ChannelStateResult:
    """A finished checkpoint's channel state: the blob bytes and its segment index.

    ``data`` holds the bytes written for this checkpoint; segments with ``parts`` also name ranges of earlier
    objects. ``placements`` say where every buffer of the checkpoint lies, for the next checkpoint's references."""

    checkpoint_id: int
    data: bytes
    segments: list[ChannelSegment]
    persisted_bytes: int
    placements: list[Placement] = field(default_factory=list, repr=False)
    recorded: dict[tuple[str, str], _Segment] = field(default_factory=dict, repr=False)
    codec: str | None = None
    packed: dict[int, bytes] = field(default_factory=dict, repr=False)
    """Compressed buffers by the buffer's identity, so that laying the result out whole compresses nothing again."""

    @property
    def empty(self) -> bool:
        return not self.segments

    @property
    def referenced_bytes(self) -> int:
        """Bytes of this checkpoint's channel state that lie in earlier objects."""
        return sum(p.length for seg in self.segments for p in seg.references())

    @property
    def incremental(self) -> bool:
        return any(seg.parts is not None for seg in self.segments)

    def whole(self) -> ChannelStateResult:
        """The same channel state with every buffer written again (no references)."""
        if not self.incremental:
            return self
        return _layout(self.checkpoint_id, self.recorded, {}, self.codec, self.packed)


def _layout(
    checkpoint_id: int, recorded: dict[tuple[str, str], _Segment], base: dict[int, Placement],
    codec: str | None = None, packed: dict[int, bytes] | None = None,
) -> ChannelStateResult:
    """Lay the segments out in one blob (inputs then outputs, channels by name); a buffer found in ``base`` is
    referenced where it lies instead of written again. With ``codec`` each buffer written is compressed on its own
    (``packed``: buffers compressed before, by identity)."""
    packed = {} if packed is None else packed
    out: list[bytes] = []
    segments: list[ChannelSegment] = []
    placements: list[Placement] = []
    offset = 0
    payload = 0
    for key in sorted(recorded, key=lambda k: (k[0] != "input", k[1])):
        seg = recorded[key]
        start = offset
        runs: list[list] = []  # [key, offset, length]: consecutive frames that lie together
        for buf in seg.buffers:
            hit = base.get(id(buf))
            if hit is not None and hit[0] is buf:
                size = hit[3]
                where = [hit[1], hit[2], size]
            else:
                stored = buf
                if codec is not None:
                    stored = packed.get(id(buf)) or packed.setdefault(id(buf), pack(codec, buf))
                size = FRAME.size + len(stored)
                out.append(FRAME.pack(len(stored)))
                out.append(stored)
                where = [None, offset, size]
                offset += size
            placements.append((buf, where[0], where[1], size))
            last = runs[-1] if runs else None
            if last is not None and last[0] == where[0] and last[1] + last[2] == where[1]:
                last[2] += size
            else:
                runs.append(where)
        length = sum(r[2] for r in runs)
        referenced = any(r[0] is not None for r in runs)
        own = [r for r in runs if r[0] is None]
        segments.append(
            ChannelSegment(
                channel=seg.info.name,
                direction=seg.info.direction,
                offset=start if not referenced else (own[0][1] if own else 0),
                length=length,
                buffer_count=len(seg.buffers),
                record_count=seg.records,
                peer_vertex=seg.info.peer_vertex,
                peer_subtask=seg.info.peer_subtask,
                partitioning=seg.info.partitioning,
                parts=[SegmentPart(key=r[0], offset=r[1], length=r[2]) for r in runs] if referenced else None,
                codec=codec,
            )
        )
        payload += sum(len(b) for b in seg.buffers)
    return ChannelStateResult(checkpoint_id, b"".join(out), segments, payload, placements, recorded, codec, packed)


class ChannelStateWriter:
    """Collects the persisted buffers of each pending checkpoint of one subtask.

    Data for a checkpoint that was never started, or was aborted, is dropped: a late buffer of an aborted
    checkpoint changes nothing.
    """

    def __init__(self, compression: str | None = None) -> None:
        self.compression = check_codec(compression)
        """The codec each persisted buffer is compressed with as a checkpoint is laid out; None: stored as is."""
        if self.compression is not None:
            pack(self.compression, b"")  # pyarrow missing: say so when the subtask starts, not at its first checkpoint
        self._recordings: dict[int, _Recording] = {}
        self._lock = threading.Lock()  # the base and the written placements: the loop and the ack worker
        self._written: dict[int, dict[int, Placement]] = {}
        self._base: dict[int, Placement] = {}
        """The latest completed checkpoint's placements, by the buffer's identity: what a checkpoint may reference."""
        self._base_checkpoint: int | None = None
        self.references_taken = False
        """Set once a trigger's write target takes references (the job asks for incremental channel state): only
        then do finished checkpoints keep their buffers until their object is written."""
        self.newly_ready = False
        """Set when a checkpoint's channel state became complete (on the subtask loop, or on an output channel's
        sender thread when its barrier went out), cleared by the loop as it hands ready checkpoints over: the loop
        stops processing the buffer in hand when this is set, so a ready checkpoint is acked at once."""

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
            self.newly_ready = self.newly_ready or rec.output_done

    def finish_output(self, checkpoint_id: int) -> None:
        rec = self._recordings.get(checkpoint_id)
        if rec is not None:
            rec.output_done = True
            self.newly_ready = self.newly_ready or rec.input_done

    def abort(self, checkpoint_id: int) -> None:
        """Drop everything collected for the checkpoint; later additions are ignored."""
        self._recordings.pop(checkpoint_id, None)
        with self._lock:
            self._written.pop(checkpoint_id, None)

    def is_recording(self, checkpoint_id: int) -> bool:
        return checkpoint_id in self._recordings

    def done(self, checkpoint_id: int) -> bool:
        rec = self._recordings.get(checkpoint_id)
        return rec is not None and rec.input_done and rec.output_done

    def ready(self) -> list[int]:
        """The checkpoints whose channel state is complete, oldest first."""
        return sorted(cid for cid, rec in self._recordings.items() if rec.input_done and rec.output_done)

    def take(self, checkpoint_id: int) -> ChannelStateResult:
        """Lay the checkpoint's segments out in one blob (inputs then outputs, channels by name) and forget them;
        buffers the latest completed checkpoint persisted are referenced where they lie."""
        return self.lay_out(checkpoint_id, self.take_recording(checkpoint_id))

    def take_recording(self, checkpoint_id: int) -> dict[tuple[str, str], _Segment]:
        """Forget the checkpoint's recording and return its segments (under the subtask's lock), for
        :meth:`lay_out` (which may run outside it: compressing a large checkpoint takes a while)."""
        rec = self._recordings.pop(checkpoint_id, None)
        if rec is None:
            raise RuntimeError(f"no channel state of checkpoint {checkpoint_id} is being written")
        return rec.segments

    def lay_out(self, checkpoint_id: int, recorded: dict[tuple[str, str], _Segment]) -> ChannelStateResult:
        """Lay a taken recording out (any thread): buffers the latest completed checkpoint persisted are
        referenced where they lie."""
        with self._lock:
            base = self._base if self._base_checkpoint is not None and self._base_checkpoint < checkpoint_id else {}
        return _layout(checkpoint_id, recorded, base, self.compression)

    def written(self, checkpoint_id: int, key: str, result: ChannelStateResult) -> None:
        """The checkpoint's object was written under ``key`` into a store that takes references: once the
        checkpoint completes, its buffers may be referenced where they lie (any thread)."""
        placed = {id(buf): (buf, k if k is not None else key, off, n) for buf, k, off, n in result.placements}
        with self._lock:
            if self._base_checkpoint is None or checkpoint_id > self._base_checkpoint:
                self._written[checkpoint_id] = placed

    def completed(self, checkpoint_id: int) -> None:
        """The checkpoint completed: its placements become the base (none when this subtask wrote no object that
        may be referenced for it), older ones are forgotten."""
        with self._lock:
            if self._base_checkpoint is not None and checkpoint_id <= self._base_checkpoint:
                return
            self._base = self._written.pop(checkpoint_id, {})
            self._base_checkpoint = checkpoint_id
            for cid in [c for c in self._written if c < checkpoint_id]:
                del self._written[cid]

    @property
    def base_checkpoint(self) -> int | None:
        """The completed checkpoint whose buffers later checkpoints may reference."""
        return self._base_checkpoint


class ChannelStateReader:
    """Decodes a channel-state blob (or one segment's bytes) back into buffers and records."""

    def __init__(self, blob: bytes) -> None:
        self.blob = blob

    def buffers(self, offset: int = 0, length: int | None = None, codec: str | None = None) -> Iterator[bytes]:
        """The persisted buffers of the byte range ``[offset, offset + length)``, in order (inflated when the
        segment's ``codec`` says they are compressed)."""
        end = len(self.blob) if length is None else offset + length
        found, stop = spans(self.blob, offset, end)
        if stop != end:
            raise ValueError(f"channel state is truncated: the buffer at {stop} passes the segment's end {end}")
        view = memoryview(self.blob)
        for start, stop in found:
            yield bytes(view[start:stop]) if codec is None else unpack(codec, view[start:stop])

    def segment_buffers(self, segment: ChannelSegment | dict) -> list[bytes]:
        seg = segment if isinstance(segment, dict) else segment.model_dump()
        return list(self.buffers(seg["offset"], seg["length"], seg.get("codec")))

    def segment_records(self, segment: ChannelSegment | dict) -> list:
        out: list = []
        for buf in self.segment_buffers(segment):
            out.extend(decode_records(buf))
        return out
