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


def test_batches_travel_as_arrow_ipc_streams_that_pyarrow_reads_without_overtake():
    import pyarrow as pa

    from spark_plugin.api.batches import SubtaskBatch

    batch = pa.record_batch({"k": [3, 1, 3], "v": ["a", "b", "c"]})
    keyed = SubtaskBatch(3, "k", batch.slice(0, 2))
    data = encode_records([batch, keyed, ("record", 1)])
    reader = BufferReader(data)
    raw = []
    while reader.has_next():
        start = reader.pos + 4
        reader.next()
        raw.append(bytes(data[start : reader.pos]))
    # each batch's bytes are one Arrow IPC stream: pyarrow's own reader opens them, no unpickling
    assert pa.ipc.open_stream(raw[0]).read_all().to_pylist() == batch.to_pylist()
    sliced = pa.ipc.open_stream(raw[1]).read_all()
    assert sliced.to_pylist() == [{"k": 3, "v": "a"}, {"k": 1, "v": "b"}]
    assert sliced.schema.metadata == {b"overtake.key_column": b"k"}
    assert raw[2][:1] == b"\x80"  # records stay pickles
    out = decode_records(data)
    assert out[0].equals(batch) and out[2] == ("record", 1)
    assert type(out[1]) is SubtaskBatch and out[1].key == 3 and out[1].column == "k"
    assert out[1].batch.equals(keyed.batch)  # the key column's note is not left in the batch's schema


def test_batches_pickled_by_an_older_version_still_decode():
    import pickle

    import pyarrow as pa

    from contract.channel_state import frame
    from spark_plugin.api.batches import KeyedBatch, SubtaskBatch

    batch = pa.record_batch({"k": [1, 2]})
    older = frame([pickle.dumps(r, protocol=5) for r in (batch, SubtaskBatch(1, "k", batch), KeyedBatch(1, 7, batch))])
    a, b, c = decode_records(older)
    assert a.equals(batch) and (b.key, b.column) == (1, "k") and b.batch.equals(batch)
    assert type(c) is KeyedBatch and c.group == 7


def test_a_keyed_batch_whose_key_is_not_its_first_rows_keeps_its_key():
    import pyarrow as pa

    from spark_plugin.api.batches import SubtaskBatch

    batch = pa.record_batch({"k": [1, 2]})
    for record in (SubtaskBatch(2, "k", batch), SubtaskBatch(1.0, "k", batch), SubtaskBatch(None, "k", batch.slice(0, 0))):
        (out,) = decode_records(encode_records([record]))
        assert (type(out.key), out.key, out.column) == (type(record.key), record.key, "k")


def test_the_record_path_never_imports_pyarrow():
    import subprocess
    import sys

    code = ("import sys; from spark_plugin.network.framing import decode_records, encode_records; "
            "assert decode_records(encode_records([1, ('a', 2.0), {'x': None}])) == [1, ('a', 2.0), {'x': None}]; "
            "print('pyarrow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _buffers_of(capacity: int, batches) -> list[tuple[bytes, int]]:
    """Every buffer a record writer's channel queues for ``batches`` written through it, in order."""
    from spark_plugin.network.mailbox import Mailbox
    from spark_plugin.network.output import OutputChannel
    from spark_plugin.network.record_writer import RecordWriter
    from spark_plugin.plan.topology import ChannelInfo

    mb = Mailbox()
    ch = OutputChannel(0, ChannelInfo("out:a[0]->b[0]", "output"), 1000, mb, lambda cid: None)
    writer = RecordWriter([ch], "forward", None, 128, capacity, mb)
    for b in batches:
        writer.emit(b)
    writer.flush_all()
    return [(item.data, item.records) for item in ch.queue]


def test_a_batch_larger_than_the_buffer_is_cut_by_rows_into_whole_arrow_records_of_about_a_buffer_each(
    monkeypatch,
):
    import pyarrow as pa

    from spark_plugin.api.batches import SubtaskBatch
    from spark_plugin.network import framing

    monkeypatch.setattr(framing, "MIN_SLICE_ROWS", 64)  # the default floor keeps slices of this batch larger
    MIN_SLICE_ROWS = 64
    rows = 20_000
    batch = pa.record_batch({"k": [i % 7 for i in range(rows)], "v": [f"row {i}" for i in range(rows)]})
    keyed = SubtaskBatch(0, "k", batch)
    small = pa.record_batch({"k": [5], "v": ["small"]})
    capacity = 16 * 1024
    buffers = _buffers_of(capacity, [small, batch, keyed])
    assert len(buffers) > 2 * len(encode_records([batch])) // capacity - 2  # cut: not one oversized buffer
    slack = len(encode_records([batch.slice(0, MIN_SLICE_ROWS)]))
    assert all(len(data) < capacity + slack for data, _ in buffers)
    assert [count_records(data) for data, _ in buffers] == [n for _, n in buffers]
    out = [r for data, _ in buffers for r in decode_records(data)]
    assert out[0].equals(small)
    plain = [r for r in out[1:] if type(r) is not SubtaskBatch]
    cut = [r for r in out[1:] if type(r) is SubtaskBatch]
    assert len(plain) > 1 and len(cut) > 1
    assert all(r.num_rows >= MIN_SLICE_ROWS for r in plain + [c.batch for c in cut])
    assert pa.Table.from_batches(plain).to_pylist() == batch.to_pylist()  # every row once, in order
    assert pa.Table.from_batches([c.batch for c in cut]).to_pylist() == batch.to_pylist()
    assert all(c.column == "k" and c.key == c.batch.column("k")[0].as_py() for c in cut)  # each keyed by its first row
    assert _opened_by_pyarrow(buffers) == [r.num_rows if type(r) is not SubtaskBatch else r.batch.num_rows
                                           for r in out]


def _opened_by_pyarrow(buffers) -> list[int]:
    """Each Arrow record's rows, read with pyarrow alone by the documented rule: a record beginning 0x01 is its
    buffer's last whole Arrow record's schema message, then the record's bytes after that first byte."""
    import pyarrow as pa

    rows = []
    for data, _ in buffers:
        pos, schema = 0, None
        while pos < len(data):
            length = int.from_bytes(data[pos : pos + 4], "little")
            record = data[pos + 4 : pos + 4 + length]
            pos += 4 + length
            if record[0] == 0x80:  # a pickle
                continue
            if record[0] == 0x01:
                record = schema + record[1:]
            else:
                schema = record[: 8 + int.from_bytes(record[4:8], "little")]
            rows.append(pa.ipc.open_stream(record).read_all().num_rows)
    return rows


def test_a_batch_of_the_schema_before_it_in_its_buffer_goes_without_the_schema_and_a_partly_read_buffer_reads_alone():
    import pyarrow as pa

    from spark_plugin.api.batches import SubtaskBatch

    a = pa.record_batch({"k": [1, 2], "v": ["a", "b"]})
    other = pa.record_batch({"x": [1.5]})
    keyed = SubtaskBatch(1, "k", a)
    records = [a, a.slice(1), ("record", 1), a, other, other, keyed, keyed, a]
    buffers = _buffers_of(1 << 20, records)
    assert len(buffers) == 1
    data = buffers[0][0]
    whole = len(encode_records([a]))
    assert len(data) < len(encode_records(records)) - 3 * (whole - len(a.serialize()))  # schemas left out
    firsts = []
    reader = BufferReader(data)
    while reader.has_next():
        firsts.append(data[reader.pos + 4])
        reader.next()
    # a's schema, again without it; a pickle; a, without it (the pickle keeps the buffer's schema); other's; keyed's
    # (the key column in the schema's metadata makes it another schema), without; a's again
    assert firsts == [0xFF, 0x01, 0x80, 0x01, 0xFF, 0x01, 0xFF, 0x01, 0xFF]
    out = decode_records(data)
    assert [type(r).__name__ for r in out] == ["RecordBatch", "RecordBatch", "tuple", "RecordBatch", "RecordBatch",
                                               "RecordBatch", "SubtaskBatch", "SubtaskBatch", "RecordBatch"]
    assert out[1].equals(a.slice(1)) and out[5].equals(other) and out[7].key == 1 and out[7].batch.equals(a)
    assert _opened_by_pyarrow(buffers) == [2, 1, 2, 1, 1, 2, 2, 2]  # the pickle is not Arrow
    for read in range(1, len(records)):  # the rest of a partly read buffer is a buffer of its own
        reader = BufferReader(data)
        for _ in range(read):
            reader.next()
        rest = reader.rest()
        assert rest[4] != 0x01, "the rest begins with a batch without its schema"
        assert [repr(r) for r in decode_records(rest)] == [repr(r) for r in out[read:]]


def test_a_batch_too_small_to_cut_and_records_of_the_record_path_stay_whole():
    import pyarrow as pa

    from spark_plugin.network.framing import MIN_SLICE_ROWS

    narrow = pa.record_batch({"v": ["x" * 20] * (2 * MIN_SLICE_ROWS - 1)})
    b = BufferBuilder(1024)
    assert b.add(narrow) is True and not b.full  # fewer rows than two slices: one buffer of its own
    assert decode_records(b.finish())[0].equals(narrow)
    wide = pa.record_batch({"v": ["x" * 20] * (3 * MIN_SLICE_ROWS - 1)})  # no runt of a slice at the end
    parts = _buffers_of(1024, [wide])
    assert [r.num_rows for data, _ in parts for r in decode_records(data)] == [MIN_SLICE_ROWS, 2 * MIN_SLICE_ROWS - 1]
    assert b.add(["x" * 5000]) is True and not b.full  # a pickled record is never cut
    assert decode_records(b.finish()) == [["x" * 5000]]


def test_a_dictionary_encoded_batch_without_its_schema_decodes_with_its_dictionary():
    import pyarrow as pa

    d = pa.record_batch({"c": pa.array(["a", "b", "a"]).dictionary_encode(), "x": [1, 2, 3]})
    ((data, _),) = _buffers_of(1 << 20, [d, d.slice(1), d])
    reader = BufferReader(data)
    reader.next()
    assert data[reader.pos + 4] == 0x01  # its dictionary message comes before its batch: read whole
    assert [r.to_pylist() for r in decode_records(data)] == [d.to_pylist(), d.slice(1).to_pylist(), d.to_pylist()]
