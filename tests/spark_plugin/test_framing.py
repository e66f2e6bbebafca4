"""Record framing: buffers hold whole length-prefixed records; the unread rest of a buffer is a byte range."""

from spark_plugin.network.framing import (
    BufferBuilder,
    BufferReader,
    count_records,
    decode_records,
    encode_records,
)


def test_builder_reports_full_at_capacity_and_resets_on_finish():
    b = BufferBuilder(64)
    full = [b.add(("key", i)) for i in range(20)]
    assert full.index(True) > 0
    n = full.index(True) + 1
    b2 = BufferBuilder(64)
    for i in range(n):
        b2.add(("key", i))
    data = b2.finish()
    assert len(data) >= 64
    assert decode_records(data) == [("key", i) for i in range(n)]
    assert b2.finish() == b"" and len(b2) == 0


def test_rest_of_a_partly_read_buffer_is_a_valid_buffer_of_the_unread_records():
    data = encode_records(range(10))
    reader = BufferReader(data)
    assert [reader.next() for _ in range(4)] == [0, 1, 2, 3]
    rest = reader.rest()
    assert data.endswith(rest)
    assert decode_records(rest) == list(range(4, 10))
    assert count_records(rest) == 6


def test_a_record_larger_than_the_buffer_gets_a_buffer_of_its_own():
    b = BufferBuilder(64)
    assert b.add("x" * 1000) is True
    assert decode_records(b.finish()) == ["x" * 1000]


def test_counting_records_refuses_a_buffer_that_does_not_end_on_a_frame_boundary():
    import pytest

    data = encode_records(["a" * 30, "b" * 30, "c" * 30])
    assert count_records(data) == 3 and count_records(b"") == 0
    first_two = len(encode_records(["a" * 30, "b" * 30]))
    with pytest.raises(ValueError, match=f"whole frames end at {first_two}"):
        count_records(data[:-5])  # the last record cut short
    with pytest.raises(ValueError, match=f"whole frames end at {len(data)}"):
        count_records(data + b"\x01\x00")  # two bytes that cannot be a length
