"""ChannelStateWriter/Reader: one blob per subtask and checkpoint, one segment per channel, exact bytes."""

from __future__ import annotations

import pytest

from client.models import ChannelSegment
from spark_plugin.channel_state import ChannelInfo, ChannelStateReader, ChannelStateWriter
from spark_plugin.framing import BufferReader, encode_records

IN_A = ChannelInfo("in:src[0]->sink[0]", "input", "src", 0, "hash")
IN_B = ChannelInfo("in:src[1]->sink[0]", "input", "src", 1, "hash")
OUT = ChannelInfo("out:sink[0]->x[0]", "output", "x", 0, "forward")


def test_buffers_of_each_channel_are_contiguous_and_decode_to_the_exact_bytes():
    w = ChannelStateWriter()
    w.start(5)
    b1, b2, b3, b4 = (encode_records(range(i, i + 3)) for i in (0, 10, 20, 30))
    w.add_input_data(IN_B, b1)
    w.add_input_data(IN_A, b2)
    w.add_input_data(IN_B, b3)
    w.add_output_data(OUT, b4, 3)
    w.finish_input()
    assert not w.done
    w.finish_output()
    assert w.done
    result = w.result()
    segs = {s["channel"]: s for s in result.segments}
    for s in result.segments:
        ChannelSegment(**s)  # the wire model accepts it
    reader = ChannelStateReader(result.data)
    assert reader.segment_buffers(segs[IN_B.name]) == [b1, b3]
    assert reader.segment_buffers(segs[IN_A.name]) == [b2]
    assert reader.segment_records(segs[OUT.name]) == [30, 31, 32]
    assert segs[IN_B.name]["buffer_count"] == 2 and segs[IN_B.name]["record_count"] == 6
    assert result.persisted_bytes == sum(len(b) for b in (b1, b2, b3, b4))
    assert [s["direction"] for s in result.segments] == ["input", "input", "output"]


def test_unprocessed_rest_of_a_buffer_is_persisted_as_its_own_byte_range():
    buf = encode_records(range(8))
    reader = BufferReader(buf)
    for _ in range(5):
        reader.next()
    w = ChannelStateWriter()
    w.start(1)
    w.add_input_data(IN_A, reader.rest())
    w.finish_input()
    w.finish_output()
    result = w.result()
    assert ChannelStateReader(result.data).segment_records(result.segments[0]) == [5, 6, 7]
    assert buf.endswith(ChannelStateReader(result.data).segment_buffers(result.segments[0])[0])


def test_aborted_writer_keeps_nothing_and_is_never_done():
    w = ChannelStateWriter()
    w.start(1)
    w.add_input_data(IN_A, encode_records([1]))
    w.abort()
    w.add_input_data(IN_A, encode_records([2]))
    w.finish_input()
    w.finish_output()
    assert not w.done
    assert w.result().segments == []


def test_wrong_direction_is_refused():
    w = ChannelStateWriter()
    w.start(1)
    with pytest.raises(ValueError, match="input channel"):
        w.add_output_data(IN_A, encode_records([1]))
