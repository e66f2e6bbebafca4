"""The segment preview: records of channel state decoded safely, within limits, from real checkpoints."""

from __future__ import annotations

import pickle
import struct

import httpx

from app.api.preview import decode_segment, render, safe_loads
from tests.ui.seed import frame

_LEN = struct.Struct("<I")


class Boom:
    def __reduce__(self):
        return (print, ("unpickled a callable",))


def _segment(*buffers: bytes) -> bytes:
    return b"".join(_LEN.pack(len(b)) + b for b in buffers)


def test_allowed_types_decode_and_anything_else_is_unsupported_with_its_hex():
    records, truncated = decode_segment(_segment(frame([("a", 1, {1, 2}), Boom()])), True, 10)
    assert not truncated
    assert [r.status for r in records] == ["ok", "unsupported"]
    assert records[0].text == "('a', 1, {1, 2})"
    assert "builtins.print" in records[1].text and records[1].hex


def test_the_unpickler_never_calls_a_class_outside_the_allow_list():
    for payload in (pickle.dumps(Boom()), b"cos\nsystem\n(S'true'\ntR."):
        try:
            safe_loads(payload)
        except Exception as exc:
            assert type(exc).__name__ == "Unsupported"
        else:
            raise AssertionError("a disallowed global was loaded")


def test_bytearray_cannot_be_asked_to_allocate_a_size():
    payload = b"\x80\x02cbuiltins\nbytearray\nJ\x00\xca\x9a;\x85R."  # bytearray(10**9)
    records, _ = decode_segment(_segment(_LEN.pack(len(payload)) + payload), True, 5)
    assert records[0].status == "error"


def test_record_and_byte_limits_cut_the_preview_and_say_so():
    seg = _segment(frame(list(range(30))), frame(list(range(30))))
    records, truncated = decode_segment(seg, True, 40)
    assert len(records) == 40 and truncated
    records, truncated = decode_segment(seg[: len(seg) // 2 + 20], False, 500)
    assert 30 <= len(records) < 60 and truncated


def test_corrupt_framing_is_shown_as_an_error_not_a_failure():
    records, _ = decode_segment(_segment(b"\xff\xff\x00\x00garbage"), True, 10)
    assert records[0].status == "error" and "framing" in records[0].text


def test_rendering_of_shared_and_cyclic_structures_is_bounded():
    a: list = []
    a.append(a)
    assert "<cycle>" in render(a)
    x: list = ["leaf"]
    for _ in range(60):
        x = [x, x]  # 2**60 leaves when printed naively
    text = render(x, limit=300)
    assert len(text) <= 300 and text.endswith("…")


def test_preview_route_decodes_a_real_checkpoints_segment(seeded):
    base = f"{seeded.url}/api/v1/jobs/{seeded.orders}/checkpoints/{seeded.unaligned_checkpoint}"
    manifest = httpx.get(f"{base}/channel-state").json()
    entry = manifest["entries"][0]
    seg = entry["segments"][0]
    params = {"vertex": entry["vertex"], "subtask_index": entry["subtask_index"], "channel": seg["channel"]}
    r = httpx.get(
        f"{base}/channel-state/preview", params={**params, "direction": seg["direction"], "max_records": 5}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["record_count"] == seg["record_count"] and len(body["records"]) == 5 and body["truncated"]
    assert body["records"][0]["text"].startswith("('order-0', 0, Decimal('0.25'), datetime.datetime(2026")


def test_preview_of_a_missing_segment_is_404_naming_the_segments_there(seeded):
    base = f"{seeded.url}/api/v1/jobs/{seeded.orders}/checkpoints/{seeded.unaligned_checkpoint}"
    params = {"vertex": "count", "subtask_index": 0, "channel": "nope", "direction": "input"}
    r = httpx.get(f"{base}/channel-state/preview", params=params)
    assert r.status_code == 404
    assert "in:source[0]->count[0]" in r.json()["error"]["message"]


def test_a_segment_written_by_the_runtimes_channel_state_writer_decodes_in_order():
    from spark_plugin.network.framing import encode_records
    from spark_plugin.plan.topology import ChannelInfo
    from spark_plugin.task.channel_state import ChannelStateWriter

    writer = ChannelStateWriter()
    writer.start(7)
    info = ChannelInfo("in:a[0]->b[0]", "input", "a", 0, "hash")
    writer.add_input_data(7, info, encode_records([("k", 1), ("k", 2)]))
    writer.add_input_data(7, info, encode_records([("k", 3)]))
    writer.finish_input(7)
    writer.finish_output(7)
    result = writer.take(7)
    (seg,) = result.segments
    data = result.data[seg.offset : seg.offset + seg.length]
    records, truncated = decode_segment(data, True, 10)
    assert [r.text for r in records] == ["('k', 1)", "('k', 2)", "('k', 3)"]
    assert [r.buffer for r in records] == [0, 0, 1] and not truncated


def test_a_compressed_segment_is_acknowledged_previewed_inflated_and_planned_with_its_codec(coordinator):
    """Through the coordinator: the ack's segment names its codec, the preview inflates it, the restore plan and
    the manifest hand the codec on to whoever reads the bytes."""
    from spark_plugin.network.framing import encode_records
    from spark_plugin.plan.topology import ChannelInfo
    from spark_plugin.task.channel_state import ChannelStateWriter
    from tests.ui.seed import Seeder

    graph = {"vertices": [{"id": "src", "parallelism": 1, "kind": "source"},
                          {"id": "snk", "parallelism": 1, "kind": "sink"}],
             "edges": [{"source": "src", "target": "snk", "partitioning": "rebalance"}]}
    writer = ChannelStateWriter("zstd")
    writer.start(1)
    info = ChannelInfo("out:src[0]->snk[0]", "output", "snk", 0, "rebalance")
    for n in range(3):
        writer.add_output_data(1, info, encode_records([("k", n, "x" * 200)] * 50), 50)
    writer.finish_input(1)
    writer.finish_output(1)
    result = writer.take(1)
    s = Seeder(coordinator.url)
    try:
        job = s.job("compressed-channel-state", graph, policy="unaligned", alignment_timeout=None)["id"]
        s.attempt(job)
        cp = s.trigger(job, policy="unaligned")
        for vertex in ("src", "snk"):
            ack: dict = {"attempt": 1, "vertex": vertex, "subtask_index": 0, "metrics": {"unaligned": True}}
            if vertex == "src":
                blob = s.upload(job, cp, "src", 0, "channel", result.data)
                ack["channel_state"] = {k: blob[k] for k in ("blob_id", "sha256", "size")}
                ack["channel_segments"] = [g.model_dump(mode="json") for g in result.segments]
                ack["metrics"]["persisted_data"] = result.persisted_bytes
            s._ok(s.http.post(f"/api/v1/jobs/{job}/checkpoints/{cp}/acks", json=ack))
        base = f"/api/v1/jobs/{job}/checkpoints/{cp}"
        (entry,) = s._ok(s.http.get(f"{base}/channel-state"))["entries"]
        assert entry["segments"][0]["codec"] == "zstd"
        params = {"vertex": "src", "subtask_index": 0, "channel": info.name, "direction": "output", "max_records": 500}
        body = s._ok(s.http.get(f"{base}/channel-state/preview", params=params))
        assert len(body["records"]) == 150 and not body["truncated"]
        assert body["records"][0]["text"] == f"('k', 0, '{'x' * 200}')"
        assert body["segment_length"] == len(result.data) < result.persisted_bytes / 5
        plan = s._ok(s.http.get(f"/api/v1/jobs/{job}/restore-plan", params={"checkpoint_id": cp}))
        (src,) = [p for p in plan["subtasks"] if p["vertex"] == "src"]
        assert [g["codec"] for g in src["output_channel_state"]] == ["zstd"]
    finally:
        s.close()


def test_arrow_records_of_a_batch_edge_are_previewed_without_unpickling(monkeypatch):
    import pyarrow as pa

    from app.api import preview
    from contract.record_codec import SubtaskBatch, encode

    def no_unpickling(*args, **kwargs):
        raise AssertionError("an Arrow record was unpickled")

    monkeypatch.setattr(preview, "safe_loads", no_unpickling)
    batch = pa.record_batch({"k": list(range(30)), "v": ["x"] * 30})
    seg = _segment(b"".join(
        _LEN.pack(len(r)) + r for r in (encode(batch), encode(SubtaskBatch(0, "k", batch.slice(0, 3))))
    ))
    (whole, keyed), truncated = decode_segment(seg, True, 10)
    assert not truncated and (whole.status, whole.type, keyed.status, keyed.type) == (
        "ok", "RecordBatch", "ok", "SubtaskBatch")
    assert whole.text.startswith("30 rows × 2 columns (k: int64, v: string); first 20 rows: [{'k': 0, 'v': 'x'}")
    assert "{'k': 20" not in whole.text
    assert keyed.text.startswith("3 rows × 2 columns (k: int64, v: string), keyed by 'k'; all rows: [{'k': 0")


def test_a_corrupt_arrow_record_is_an_error_with_its_hex_not_a_failure():
    import pyarrow as pa

    from contract.record_codec import encode

    good = encode(pa.record_batch({"k": [1, 2, 3]}))
    broken = good[:-40]  # cut inside the batch's body
    seg = _segment(b"".join(_LEN.pack(len(r)) + r for r in (b"\xff\xff\xff\xffjunk", broken)))
    records, _ = decode_segment(seg, True, 10)
    assert [r.status for r in records] == ["error", "error"]
    assert all("Arrow" in r.text and r.hex for r in records)


def test_a_batch_written_without_its_schema_is_previewed_with_its_buffers_schema_and_alone_is_an_error():
    import pyarrow as pa

    from spark_plugin.network.framing import BufferBuilder

    a = pa.record_batch({"k": [1, 2], "v": ["a", "b"]})
    b = BufferBuilder(1 << 20)
    for r in (a, a.slice(1), ("record", 1), a.slice(0, 1)):
        b.add(r)
    buffer = b.finish()
    records, truncated = decode_segment(_segment(buffer), True, 10)
    assert not truncated and [(r.status, r.type) for r in records] == [
        ("ok", "RecordBatch"), ("ok", "RecordBatch"), ("ok", "tuple"), ("ok", "RecordBatch")]
    assert records[1].text.startswith("1 rows × 2 columns (k: int64, v: string); all rows: [{'k': 2, 'v': 'b'}]")
    assert records[3].text.endswith("[{'k': 1, 'v': 'a'}]")
    assert records[1].size + len(a.schema.serialize()) < records[0].size  # it travelled without the schema
    orphans, _ = decode_segment(_segment(buffer[4 + records[0].size:]), True, 10)  # cut after the first record
    assert [r.status for r in orphans] == ["error", "ok", "error"]
    assert all("without its schema" in orphans[i].text and orphans[i].hex for i in (0, 2))
