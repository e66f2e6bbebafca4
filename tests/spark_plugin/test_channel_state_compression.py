"""Compressed channel state (``NetworkConfig.channel_state_compression``): each buffer compressed on its own, so a
segment still reads alone by its byte range, incremental references still name single buffers, the preview
inflates it, and a checkpoint written before compression existed (no codec) restores as before. And the export of a
checkpoint's Arrow batches into Arrow IPC files that pyarrow opens."""

from __future__ import annotations

from typing import NamedTuple

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from app.api.preview import decode_segment
from contract.channel_state import FRAME, frame, pack
from contract.models import ChannelSegment, RestoreSegment
from spark_plugin.network.config import NetworkConfig
from spark_plugin.network.framing import encode_records
from spark_plugin.network.recovered import segment_buffers
from spark_plugin.plan.topology import ChannelInfo
from spark_plugin.task.channel_state import ChannelStateReader, ChannelStateResult, ChannelStateWriter
from spark_plugin.task.channel_state_export import export_arrow

IN_A = ChannelInfo("in:src[0]->agg[0]", "input", "src", 0, "hash")
IN_B = ChannelInfo("in:src[1]->agg[0]", "input", "src", 1, "hash")
OUT = ChannelInfo("out:agg[0]->sink[0]", "output", "sink", 0, "forward")
KEY = "job-7/cp-000000000001/agg-0-a1.state"


def _take(w: ChannelStateWriter, cid: int, by_channel: dict[ChannelInfo, list[bytes]]) -> ChannelStateResult:
    w.start(cid)
    for info, buffers in by_channel.items():
        for b in buffers:
            if info.direction == "input":
                w.add_input_data(cid, info, b)
            else:
                w.add_output_data(cid, info, b, 1)
    w.finish_input(cid)
    w.finish_output(cid)
    return w.take(cid)


def _ranged(blobs: dict[str, bytes]):
    """A restore's fetch that hands out only the byte range asked for, and records what was asked."""
    asked: list[tuple[str, int | None, int | None]] = []

    def fetch(blob_id: str, start: int | None, end: int | None) -> bytes:
        asked.append((blob_id, start, end))
        data = blobs[blob_id]
        return data if start is None else data[start : end + 1]

    fetch.asked = asked  # type: ignore[attr-defined]
    return fetch


def _restore_segment(seg: ChannelSegment, blob_id: str = "b" * 32) -> RestoreSegment:
    return RestoreSegment(**seg.model_dump(), blob_id=blob_id, from_subtask=0)


def _compressible(i: int) -> bytes:
    return encode_records([{"key": i % 3, "value": j, "name": "sensor-reading"} for j in range(200)])


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_each_segment_of_a_compressed_blob_restores_exactly_from_its_own_byte_range(codec):
    by_channel = {IN_A: [_compressible(i) for i in range(3)], IN_B: [_compressible(9)], OUT: [_compressible(5)]}
    plain = _take(ChannelStateWriter(), 1, by_channel)
    packed = _take(ChannelStateWriter(codec), 1, by_channel)
    assert len(packed.data) < len(plain.data) / 3, "repetitive records did not shrink"
    assert packed.persisted_bytes == plain.persisted_bytes  # the in-flight bytes persisted, as they travelled
    fetch = _ranged({"b" * 32: packed.data})
    for seg in packed.segments:
        assert seg.codec == codec
        info = next(i for i in by_channel if i.name == seg.channel)
        fetch.asked.clear()
        assert segment_buffers(fetch, _restore_segment(seg)) == by_channel[info]
        assert fetch.asked == [("b" * 32, seg.offset, seg.offset + seg.length - 1)]  # its range only
        assert ChannelStateReader(packed.data).segment_buffers(seg) == by_channel[info]


def test_a_compressed_checkpoint_references_buffers_still_in_flight_and_reads_back_from_both_objects():
    w = ChannelStateWriter("zstd")
    queued = [_compressible(i) for i in range(4)]
    first = _take(w, 1, {IN_A: queued})
    w.written(1, KEY, first)
    w.completed(1)
    new = _compressible(7)
    second = _take(w, 2, {IN_A: [*queued[2:], new]})
    (seg,) = second.segments
    assert [p.key for p in seg.parts] == [KEY, None]
    assert len(second.data) == seg.parts[1].length  # only the new buffer was written (compressed)
    blobs = {"a" * 32: first.data, "c" * 32: second.data}
    restore = RestoreSegment(
        **{**seg.model_dump(), "parts": [{**p.model_dump(), "blob_id": "a" * 32 if p.key else None} for p in seg.parts]},
        blob_id="c" * 32, from_subtask=0,
    )
    assert segment_buffers(_ranged(blobs), restore) == [*queued[2:], new]
    # laid out whole again (an upload through the coordinator), it reads back the same
    whole = second.whole()
    assert whole.codec == "zstd" and not whole.incremental
    assert ChannelStateReader(whole.data).segment_buffers(whole.segments[0]) == [*queued[2:], new]


def test_an_ack_segment_stored_before_compression_existed_restores_unchanged():
    """Segments acknowledged by an older runtime have no codec field: their bytes are the buffers as they travelled."""
    buffers = [encode_records(["a", 1]), encode_records(["b", 2])]
    blob = b"xx" + frame(buffers)
    stored = {"channel": IN_A.name, "direction": "input", "offset": 2, "length": len(blob) - 2, "buffer_count": 2,
              "record_count": 4, "peer_vertex": "src", "peer_subtask": 0, "partitioning": "hash", "parts": None}
    seg = RestoreSegment(**stored, blob_id="b" * 32, from_subtask=0)
    assert seg.codec is None
    assert segment_buffers(_ranged({"b" * 32: blob}), seg) == buffers
    assert ChannelStateReader(blob).segment_records(stored) == ["a", 1, "b", 2]


def test_an_uncompressed_writer_still_writes_the_buffers_as_they_travelled():
    buffers = [encode_records(range(5))]
    result = _take(ChannelStateWriter(), 1, {IN_A: buffers})
    assert result.data == frame(buffers) and result.segments[0].codec is None


@pytest.mark.parametrize("value", ["gzip", "LZ4", ""])
def test_an_unknown_compression_setting_is_refused_naming_the_codecs_that_work(value):
    with pytest.raises(ValueError, match=rf"channel_state_compression {value!r} .*'lz4', 'zstd'"):
        NetworkConfig(channel_state_compression=value)
    with pytest.raises(ValueError, match="use one of"):
        ChannelStateWriter(value)


def test_a_segment_that_names_an_unknown_codec_is_refused_by_the_contract():
    with pytest.raises(ValueError, match="codec"):
        ChannelSegment(channel="c", direction="input", offset=0, length=0, buffer_count=0, record_count=0,
                       codec="snappy")


def test_the_preview_inflates_a_compressed_segment_and_refuses_a_buffer_that_claims_to_inflate_too_far():
    result = _take(ChannelStateWriter("lz4"), 1, {IN_A: [encode_records([("a", 1), ("b", 2)])]})
    records, truncated = decode_segment(result.data, True, 10, "lz4")
    assert [r.text for r in records] == ["('a', 1)", "('b', 2)"] and not truncated
    bomb = FRAME.pack(2**31) + pack("lz4", b"x" * 10)[FRAME.size:]
    records, truncated = decode_segment(frame([bomb]), True, 10, "lz4")
    assert [r.status for r in records] == ["error"] and "inflates to 2147483648 bytes" in records[0].text


class SubBatch(NamedTuple):
    key_group: int
    batch: pa.RecordBatch


def test_a_checkpoints_arrow_batches_export_to_ipc_files_that_pyarrow_opens(tmp_path):
    b1 = pa.record_batch({"key": [1, 2, 3], "value": [10, 20, 30]})
    b2 = pa.record_batch({"key": [4], "value": [40]})
    w = ChannelStateWriter("zstd")
    result = _take(w, 3, {IN_A: [encode_records([b1, SubBatch(5, b2)])], OUT: [encode_records(["a record"])]})
    segs = {s.direction: _restore_segment(s) for s in result.segments}
    done = export_arrow([("agg", segs["input"]), ("agg", segs["output"])], _ranged({"b" * 32: result.data}),
                        tmp_path, checkpoint_id=3)
    written, skipped = done
    assert skipped.path is None and skipped.other_records == 1
    assert written.rows == 4 and written.batches == 2
    with ipc.open_file(written.path) as f:
        table = f.read_all()
    assert table.column("key").to_pylist() == [1, 2, 3, 4]
    meta = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    assert meta["overtake.channel"] == IN_A.name and meta["overtake.direction"] == "input"
    assert meta["overtake.subtask"] == "0" and meta["overtake.peer_vertex"] == "src"
    assert meta["overtake.checkpoint_id"] == "3" and meta["overtake.vertex"] == "agg"


def test_a_preview_cut_inside_a_compressed_buffer_shows_the_whole_buffers_before_it_and_says_it_is_truncated():
    buffers = [encode_records([("a", i)]) for i in range(3)]
    result = _take(ChannelStateWriter("zstd"), 1, {IN_A: buffers})
    (seg,) = result.segments
    cut = result.data[: seg.length - 3]  # the byte limit of the preview ends inside the last buffer
    records, truncated = decode_segment(cut, False, 10, "zstd")
    assert [r.text for r in records] == ["('a', 0)", "('a', 1)"] and truncated
