"""ChannelStateWriter/Reader: one blob per subtask and checkpoint, one segment per channel, exact bytes."""

from __future__ import annotations

import pytest

from contract.channel_state import spans
from spark_plugin.network.framing import BufferReader, encode_records
from spark_plugin.plan.topology import ChannelInfo
from spark_plugin.task.channel_state import ChannelStateReader, ChannelStateWriter

IN_A = ChannelInfo("in:src[0]->sink[0]", "input", "src", 0, "hash")
IN_B = ChannelInfo("in:src[1]->sink[0]", "input", "src", 1, "hash")
OUT = ChannelInfo("out:sink[0]->x[0]", "output", "x", 0, "forward")


def test_buffers_of_each_channel_are_contiguous_and_decode_to_the_exact_bytes():
    w = ChannelStateWriter()
    w.start(5)
    b1, b2, b3, b4 = (encode_records(range(i, i + 3)) for i in (0, 10, 20, 30))
    w.add_input_data(5, IN_B, b1)
    w.add_input_data(5, IN_A, b2)
    w.add_input_data(5, IN_B, b3)
    w.add_output_data(5, OUT, b4, 3)
    w.finish_input(5)
    assert not w.done(5)
    w.finish_output(5)
    assert w.done(5) and w.ready() == [5]
    result = w.take(5)
    segs = {s.channel: s for s in result.segments}
    reader = ChannelStateReader(result.data)
    assert reader.segment_buffers(segs[IN_B.name]) == [b1, b3]
    assert reader.segment_buffers(segs[IN_A.name]) == [b2]
    assert reader.segment_records(segs[OUT.name]) == [30, 31, 32]
    assert segs[IN_B.name].buffer_count == 2 and segs[IN_B.name].record_count == 6
    assert result.persisted_bytes == sum(len(b) for b in (b1, b2, b3, b4))
    assert [s.direction for s in result.segments] == ["input", "input", "output"]
    assert not w.is_recording(5)  # taken: the writer forgot it


def test_the_blob_is_framed_buffers_that_the_contracts_format_reads_without_unpickling():
    w = ChannelStateWriter()
    w.start(1)
    buffers = [encode_records(["a", "b"]), encode_records(["c"])]
    for b in buffers:
        w.add_input_data(1, IN_A, b)
    w.finish_input(1)
    w.finish_output(1)
    result = w.take(1)
    found, end = spans(result.data)
    assert end == len(result.data)
    assert [result.data[a:b] for a, b in found] == buffers


def test_unprocessed_rest_of_a_buffer_is_persisted_as_its_own_byte_range():
    buf = encode_records(range(8))
    reader = BufferReader(buf)
    for _ in range(5):
        reader.next()
    w = ChannelStateWriter()
    w.start(1)
    w.add_input_data(1, IN_A, reader.rest())
    w.finish_input(1)
    w.finish_output(1)
    result = w.take(1)
    assert ChannelStateReader(result.data).segment_records(result.segments[0]) == [5, 6, 7]
    assert buf.endswith(ChannelStateReader(result.data).segment_buffers(result.segments[0])[0])


def test_two_checkpoints_record_apart_and_finish_in_their_own_time():
    w = ChannelStateWriter()
    w.start(1)
    w.start(2)
    w.add_input_data(1, IN_A, encode_records([1]))
    w.add_input_data(2, IN_A, encode_records([2]))
    w.add_input_data(1, IN_A, encode_records([3]))
    for cid in (2, 1):
        w.finish_input(cid)
        w.finish_output(cid)
    assert w.ready() == [1, 2]
    one, two = w.take(1), w.take(2)
    assert ChannelStateReader(one.data).segment_records(one.segments[0]) == [1, 3]
    assert ChannelStateReader(two.data).segment_records(two.segments[0]) == [2]


def test_an_aborted_checkpoint_keeps_nothing_and_is_never_done():
    w = ChannelStateWriter()
    w.start(1)
    w.add_input_data(1, IN_A, encode_records([1]))
    w.abort(1)
    w.add_input_data(1, IN_A, encode_records([2]))
    w.finish_input(1)
    w.finish_output(1)
    assert not w.done(1) and w.ready() == []
    with pytest.raises(RuntimeError, match="no channel state of checkpoint 1"):
        w.take(1)


def test_wrong_direction_is_refused():
    w = ChannelStateWriter()
    w.start(1)
    with pytest.raises(ValueError, match="input channel"):
        w.add_output_data(1, IN_A, encode_records([1]), 1)


def test_a_truncated_segment_is_refused_by_the_reader():
    data = ChannelStateWriter()
    data.start(1)
    data.add_input_data(1, IN_A, encode_records(range(10)))
    data.finish_input(1)
    data.finish_output(1)
    result = data.take(1)
    with pytest.raises(ValueError, match="truncated"):
        list(ChannelStateReader(result.data[:-3]).buffers())
