"""Batch pipelines (Arrow record batches as records), every subtask a thread: the vectorized operators, the keyed
split by key group, running aggregates per key, and exactly-once across a restore and a rescale of an unaligned
checkpoint taken under backpressure."""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from contract.events import JobStatusChanged
from contract.keygroups import _mix, key_group, operator_index, stable_hash_v1
from contract.models import RestoreSegment
from spark_plugin import CollectSink, ParquetSink, ParquetSource, Pipeline, PipelineError
from spark_plugin.api.batches import (
    KeyedBatch,
    KeyedBatchAggregate,
    SplitByKeyGroup,
    SubtaskBatch,
    route_key,
    split_by_key_group,
)
from spark_plugin.connectors import JsonLinesSource
from spark_plugin.network.config import NetworkConfig
from spark_plugin.network.elements import is_marker
from spark_plugin.network.framing import BufferReader, decode_records
from spark_plugin.network.recovered import segment_buffers
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.fakes import InMemoryCoordinator
from tests.spark_plugin.test_rescale_threads import rescale_plan
from tests.spark_plugin.test_restore_threads import SMALL, plan_from_acks
from tests.spark_plugin.test_subtask_threads import wait_for

KEYS = 23
FILES = 4


def write_input(directory, rows_per_file: int) -> list[dict]:
    """``FILES`` Parquet files of rows ``{"k": key, "v": value, "seq": n}``, key ``n % KEYS`` (str keys for half
    of them: keys of two types); returns every row."""
    rows = []
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(FILES):
        part = [{"k": f"user-{n % KEYS}", "v": n % 17, "seq": n}
                for n in range(f * rows_per_file, (f + 1) * rows_per_file)]
        pq.write_table(pa.Table.from_pylist(part), directory / f"part-{f}.parquet", row_group_size=250)
        rows += part
    return rows


def expected(rows: list[dict]) -> dict:
    """Per key, over the rows the pipeline keeps (v not a multiple of 3): the sum and count of w = 2v, max of v."""
    out: dict = defaultdict(lambda: {"w_sum": 0, "w_count": 0, "v_max": None})
    for r in rows:
        if r["v"] % 3:
            e = out[r["k"]]
            e["w_sum"] += 2 * r["v"]
            e["w_count"] += 1
            e["v_max"] = r["v"] if e["v_max"] is None else max(e["v_max"], r["v"])
    return dict(out)


def slow(batch):
    time.sleep(0.004)  # per batch of per-key updates: backpressure on the keyed edge
    return batch


def batch_pipeline(directory, sink, keyed: int = 2, slow_down: bool = False) -> Pipeline:
    p = Pipeline("batches", parallelism=2)
    stream = (
        p.source(ParquetSource(str(directory), batch_rows=50, batches=True), id="src")
        .filter(lambda b: b["v"].to_numpy() % 3 != 0)
        .map_batches(lambda df: df.assign(w=df.v * 2), format="pandas", id="double")
        .key_by("k")
        .aggregate({"w": ["sum", "count"], "v": "max"}, id="agg", parallelism=keyed)
    )
    if slow_down:
        stream = stream.map_batches(slow, id="slow")
    stream.rows(id="rows").sink(sink, id="out")
    return p


def finals(results) -> tuple[dict, dict]:
    """The furthest running aggregate each key reached (the one of most rows), and per subtask's sink and key the
    counts it went through in order. A key's furthest aggregate, not the last one met: after a rescale a sink's
    restored output may hold a key's earlier aggregates from the old subtask that had the key before."""
    last, counts = {}, defaultdict(list)
    for i, res in enumerate(results):
        for name, out in res.outputs.items():
            for row in out.get("records", []):
                if row["k"] not in last or row["w_count"] > last[row["k"]]["w_count"]:
                    last[row["k"]] = {x: row[x] for x in ("w_sum", "w_count", "v_max")}
                counts[(i, name, row["k"])].append(row["w_count"])
    return last, counts


def test_split_by_key_group_keeps_every_row_once_in_order_in_the_key_group_records_use():
    keys = [f"u{n % 7}" for n in range(200)] + [3, 3.5, None]
    batch = pa.RecordBatch.from_pylist([{"k": str(k) if k is not None else None, "n": i} for i, k in enumerate(keys)])
    parts = list(split_by_key_group(batch, "k", 128))
    assert sorted(n for part in parts for n in part.batch.column("n").to_pylist()) == list(range(len(keys)))
    for part in parts:
        ks = part.batch.column("k").to_pylist()
        assert {key_group(k, 128) for k in ks} == {part.group}, "a sub-batch spans key groups"
        assert key_group(part.key, 128) == part.group
        ns = part.batch.column("n").to_pylist()
        assert ns == sorted(ns), "rows were reordered"


@pytest.mark.parametrize("kind", [pa.int64(), pa.int8(), pa.float64(), pa.float32(), pa.decimal128(10, 2)], ids=str)
def test_a_row_of_a_batch_has_the_key_group_of_a_record_with_an_equal_key(kind):
    """A key column of any numeric type: the row with 7 (7.0, 7.00) goes where the record keyed 7 goes, 2.5 where
    the record keyed 2.5 goes."""
    values = [7, 2.5, 0, -3, 7] if not pa.types.is_integer(kind) else [7, 0, -3, 7]
    batch = pa.RecordBatch.from_pydict({"k": pa.array([Decimal(str(v)) for v in values] if pa.types.is_decimal(kind)
                                                      else values, type=kind)})
    for part in split_by_key_group(batch, "k", 128):
        for v in part.batch.column("k").to_pylist():
            record_key = int(v) if v == int(v) else float(v)
            assert key_group(record_key, 128) == part.group, (v, record_key)


def test_a_sub_batch_split_by_the_old_key_hash_is_split_anew_into_the_key_groups_of_its_keys():
    """In flight in a checkpoint of key hash version 1, a sub-batch's key group is that hash's: its rows are counted
    under the key groups (and keys) the current hash gives them, as later rows of the same keys are."""
    agg = KeyedBatchAggregate("agg", "k", {"v": "count"})
    agg.open(0, 1, 128)
    agg.restore({"keyed": {}})  # a snapshot without a key hash version: version 1
    got = []
    process = agg.bind(got.append)
    stale = pa.RecordBatch.from_pydict({"k": [1.0, 2.0, 1.0], "v": [1, 1, 1]})
    process(KeyedBatch(1.0, _mix(stable_hash_v1(1.0)) % 128, stale))
    for part in split_by_key_group(pa.RecordBatch.from_pydict({"k": [1.0, 2.0], "v": [1, 1]}), "k", 128):
        process(part)
    assert agg.state.get(1) == {("v", "count"): 3} and agg.state.get(2) == {("v", "count"): 2}
    assert all(key_group(k, 128) == g for g, d in agg.state.groups.items() for k in d)


@pytest.mark.parametrize("parallelism", [1, 2, 3, 5])
def test_the_edge_splits_a_batch_into_one_part_per_target_subtask_by_the_record_paths_assignment(parallelism):
    """Each part holds exactly the rows whose key group the subtask owns (``operator_index``, as a record with the
    same key is routed), rows in their order, and there are at most ``parallelism`` parts."""
    keys = [f"u{n % 37}" for n in range(500)] + [3, 3.5, None]
    batch = pa.RecordBatch.from_pylist([{"k": str(k) if k is not None else None, "n": i} for i, k in enumerate(keys)])
    parts = route_key.split_rows(SubtaskBatch("u0", "k", batch), 128, lambda g: operator_index(g, 128, parallelism))
    assert len(parts) == len({operator_index(key_group(k, 128), 128, parallelism)
                              for k in batch.column("k").to_pylist()}) <= parallelism
    assert sorted(n for _, part in parts for n in part.batch.column("n").to_pylist()) == list(range(len(keys)))
    for owner, part in parts:
        ks = part.batch.column("k").to_pylist()
        assert {operator_index(key_group(k, 128), 128, parallelism) for k in ks} == {owner}
        assert part.key == ks[0] and part.column == "k"
        ns = part.batch.column("n").to_pylist()
        assert ns == sorted(ns), "rows were reordered"


def test_an_old_single_key_group_sub_batch_goes_whole_to_the_owner_of_its_key_group():
    batch = pa.RecordBatch.from_pydict({"k": ["a", "a"], "v": [1, 2]})
    old = KeyedBatch("a", key_group("a", 128), batch)
    [(owner, part)] = route_key.split_rows(old, 128, lambda g: operator_index(g, 128, 3))
    assert part is old and owner == operator_index(key_group("a", 128), 128, 3)


def test_a_keyed_aggregate_refuses_rows_of_a_key_group_it_does_not_own_and_keeps_no_state_of_them():
    agg = KeyedBatchAggregate("agg", "k", {"v": "count"})
    agg.open(0, 2, 128)  # key groups 0..63
    process = agg.bind(lambda b: None)
    mine = next(f"k{n}" for n in range(100) if key_group(f"k{n}", 128) < 64)
    other = next(f"k{n}" for n in range(100) if key_group(f"k{n}", 128) >= 64)
    with pytest.raises(RuntimeError, match=f"key {other!r} .*another subtask"):
        process(SubtaskBatch(mine, "k", pa.RecordBatch.from_pydict({"k": [mine, other], "v": [1, 1]})))
    assert not any(agg.state.groups.values())


def test_a_keyed_aggregate_updates_each_key_of_a_multi_group_sub_batch_in_its_own_key_group():
    agg = KeyedBatchAggregate("agg", "k", {"v": ["count", "sum"]})
    agg.open(0, 1, 128)
    got = []
    process = agg.bind(got.append)
    keys = [f"k{n % 9}" for n in range(90)]
    process(SubtaskBatch(keys[0], "k", pa.RecordBatch.from_pydict({"k": keys, "v": list(range(90))})))
    assert len({key_group(k, 128) for k in keys}) > 1
    assert {g: sorted(d) for g, d in agg.state.groups.items()} == {
        g: sorted(k for k in set(keys) if key_group(k, 128) == g) for g in {key_group(k, 128) for k in keys}}
    assert agg.state.get("k4") == {("v", "count"): 10, ("v", "sum"): sum(range(4, 90, 9))}
    [result] = got
    assert sorted(result.column("k").to_pylist()) == sorted(set(keys))


def test_a_batch_pipeline_computes_the_same_aggregates_as_pyarrow_over_all_rows(tmp_path):
    rows = write_input(tmp_path / "in", 600)
    coord = InMemoryCoordinator()
    results = ThreadedRun(batch_pipeline(tmp_path / "in", CollectSink()), coord.reporter, coord.events,
                          SMALL).start().join(60)
    last, counts = finals(results)
    assert last == expected(rows)
    assert all(c == sorted(c) for c in counts.values()), "a key's running counts went back: reordered"


def test_a_record_stream_and_a_batch_stream_convert_into_each_other(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(f'{{"k": "a{n % 3}", "v": {n}}}\n' for n in range(100)))
    p = Pipeline("convert", parallelism=1)
    (p.source(JsonLinesSource(str(path), batches=True, batch_rows=7), id="src")
     .map_batches(lambda b: b.append_column("v2", pc.multiply(b["v"], 2)))
     .rows(id="rows")
     .map(lambda r: {**r, "v3": r["v2"] + r["v"]})
     .sink(CollectSink(), id="out"))
    coord = InMemoryCoordinator()
    [res] = ThreadedRun(p, coord.reporter, coord.events, SMALL).start().join(60)
    got = res.outputs["out"]["records"]
    assert [r["v3"] for r in got] == [3 * n for n in range(100)]


def test_a_batch_stream_refuses_record_functions_and_bad_aggregates_before_running(tmp_path):
    p = Pipeline("bad", parallelism=1)
    stream = p.source(ParquetSource(str(tmp_path), batches=True), id="src")
    with pytest.raises(PipelineError, match="map_batches"):
        stream.map(lambda r: r)
    with pytest.raises(PipelineError, match="choose from sum, count, min, max, mean"):
        stream.key_by("k").aggregate({"v": "median"})
    with pytest.raises(PipelineError, match="format 'polars'"):
        stream.map_batches(lambda b: b, format="polars")


def in_flight(coord, acks, vertex: str) -> list:
    """The keyed batches persisted in the checkpoint's input channel state of ``vertex``."""
    out = []
    for (v, index), ack in acks.items():
        if v != vertex:
            continue
        blob = (ack.get("channel_state") or {}).get("blob_id")
        for seg in ack["channel_segments"]:
            if seg["direction"] != "input":
                continue
            segment = RestoreSegment(**{**seg, "blob_id": blob, "from_subtask": index})
            for b in segment_buffers(lambda blob_id, start, end: coord.blobs[blob_id][start : end + 1], segment):
                out += [r for r in decode_records(b) if not is_marker(r)]
    return out


def owners(record, parallelism: int) -> set[int]:
    """The subtasks at ``parallelism`` that own the key groups of ``record``'s rows."""
    column = record.column if isinstance(record, SubtaskBatch) else "k"
    return {operator_index(key_group(k, 128), 128, parallelism) for k in record.batch.column(column).to_pylist()}


def multi_group(record) -> bool:
    """Whether ``record`` holds rows of several key groups."""
    return len({key_group(k, 128) for k in record.batch.column("k").to_pylist()}) > 1


def checkpoint_under_backpressure(tmp_path, keyed: int, network: NetworkConfig = SMALL):
    """Run the slowed batch pipeline with the keyed stage at ``keyed``, take unaligned checkpoint 1 once sub-batches
    flow, stop; the coordinator and the checkpoint's acks."""
    coord = InMemoryCoordinator()
    first = ThreadedRun(batch_pipeline(tmp_path / "in", CollectSink(), keyed=keyed, slow_down=True), coord.reporter,
                        coord.events, network).start()
    wait_for(lambda: first.subtask("agg", 0).records_in > 40, "sub-batches to flow")
    coord.trigger(1, "unaligned")
    wait_for(lambda: len(coord.acks.get(1, {})) == 2 + keyed, "checkpoint 1")
    coord.publish(JobStatusChanged(status="CANCELLED"))
    first.join(60)
    return coord, coord.acks[1]


def restore_and_check(tmp_path, rows, coord, acks, keyed_before: int, keyed_after: int,
                      network: NetworkConfig = SMALL) -> None:
    """Restore checkpoint 1 with the keyed stage at ``keyed_after`` and run to the end: every key's running
    aggregates end where one pass over the input ends them (a lost or repeated row would change a count), and a
    key's counts only grow."""
    old = plan_from_acks(acks)
    plan = old if keyed_after == keyed_before else rescale_plan(acks, "agg", keyed_after)

    def fetch(blob_id, start, end):
        data = coord.blobs[blob_id]
        return data if start is None else data[start : end + 1]

    second_coord = InMemoryCoordinator()
    second = ThreadedRun(batch_pipeline(tmp_path / "in", CollectSink(), keyed=keyed_after, slow_down=True),
                         second_coord.reporter, second_coord.events, network, restore=plan, fetch=fetch,
                         restore_checkpoint=1)
    last, counts = finals(second.start().join(120))
    want = expected(rows)
    # keys whose every row was counted before the checkpoint emit nothing after it; the others end exactly
    assert {k: v for k, v in want.items() if k in last} == last
    assert all(c == sorted(c) for c in counts.values()), "a key's running counts went back: reordered or repeated"


@pytest.mark.parametrize(("keyed_before", "keyed_after", "compression"),
                         [(2, 2, None), (2, 3, None), (3, 2, None), (2, 2, "zstd"), (2, 3, "zstd")])
def test_a_restore_of_an_unaligned_checkpoint_of_a_batch_pipeline_is_exactly_once(tmp_path, keyed_before,
                                                                                 keyed_after, compression):
    """Stopped after an unaligned checkpoint taken under backpressure, whose in-flight sub-batches each hold rows of
    several key groups, restored at the same parallelism or with the keyed stage rescaled 2 → 3 or 3 → 2, where a
    sub-batch's key groups may now belong to different subtasks and it is split again; and with the channel state
    compressed."""
    network = dataclasses.replace(SMALL, channel_state_compression=compression)
    rows = write_input(tmp_path / "in", 1500)
    for _ in range(4):  # on a loaded machine a checkpoint may catch nothing in flight: take it again
        coord, acks = checkpoint_under_backpressure(tmp_path, keyed_before, network)
        records = in_flight(coord, acks, "agg")
        if any(len(owners(r, keyed_after)) > 1 if keyed_after != keyed_before else multi_group(r)
               for r in records):
            break
    assert records, "no sub-batch in flight in the checkpoint: not an unaligned restore under backpressure"
    assert all(isinstance(r, SubtaskBatch) for r in records)
    assert any(multi_group(r) for r in records), (
        "no in-flight sub-batch holds rows of several key groups"
    )
    if keyed_after != keyed_before:
        assert any(len(owners(r, keyed_after)) > 1 for r in records), (
            f"no in-flight sub-batch spans subtasks at parallelism {keyed_after}: the re-split is not exercised"
        )
    assert {g.get("codec") for ack in acks.values() for g in ack["channel_segments"]} == {compression}
    restore_and_check(tmp_path, rows, coord, acks, keyed_before, keyed_after, network)


def test_sub_batches_cut_across_buffers_restore_exactly_once_from_an_unaligned_checkpoint(tmp_path, monkeypatch):
    """Batches larger than a buffer travel as row slices, each a whole Arrow record (here cut down to 4 rows: the
    default floor of 8,192 keeps these small batches whole). An unaligned checkpoint under backpressure persists
    slices in flight, and a restore with the keyed stage rescaled 2 → 3 replays them exactly once, in order."""
    from contract.record_codec import slice_rows
    from spark_plugin.network import framing

    cuts: list[int] = []

    def counted(record, offset, length):
        cuts.append(length)
        return slice_rows(record, offset, length)

    monkeypatch.setattr(framing, "MIN_SLICE_ROWS", 4)
    monkeypatch.setattr(framing, "slice_rows", counted)
    rows = write_input(tmp_path / "in", 1500)
    coord, acks = checkpoint_under_backpressure(tmp_path, 2)
    assert cuts and min(cuts) >= 4, "no batch was cut across buffers"
    records = in_flight(coord, acks, "agg")
    assert records and all(isinstance(r, SubtaskBatch) for r in records)
    restore_and_check(tmp_path, rows, coord, acks, 2, 3)


def persisted_firsts(coord, acks, vertex: str) -> list[int]:
    """The first byte of every record persisted in the input channel state of ``vertex``."""
    firsts = []
    for (v, index), ack in acks.items():
        blob = (ack.get("channel_state") or {}).get("blob_id")
        for seg in ack["channel_segments"] if v == vertex else []:
            if seg["direction"] == "input":
                segment = RestoreSegment(**{**seg, "blob_id": blob, "from_subtask": index})
                for b in segment_buffers(lambda blob_id, start, end: coord.blobs[blob_id][start : end + 1], segment):
                    reader = BufferReader(b)
                    while reader.has_next():
                        firsts.append(b[reader.pos + 4])
                        reader.next()
    return firsts


def test_sub_batches_sharing_their_buffers_schema_restore_exactly_once_from_an_unaligned_checkpoint(tmp_path):
    """Buffers of 8 kB hold several sub-batches: after the first, each travels without its schema. An unaligned
    checkpoint under backpressure persists such buffers in flight (and the rest of one the barrier overtook, given
    its schema again), and a restore with the keyed stage rescaled 2 → 3 replays them exactly once, in order."""
    network = NetworkConfig(buffer_size=8192)
    rows = write_input(tmp_path / "in", 1500)
    for _ in range(4):  # on a loaded machine a checkpoint may catch nothing in flight: take it again
        coord, acks = checkpoint_under_backpressure(tmp_path, 2, network)
        firsts = persisted_firsts(coord, acks, "agg")
        if 0x01 in firsts:
            break
    assert 0x01 in firsts, "no sub-batch without its schema in flight in the checkpoint"
    assert all(f in (0x01, 0xFF, 0x80) for f in firsts)
    restore_and_check(tmp_path, rows, coord, acks, 2, 3, network)


def split_by_key_group_as_before(self, out):
    """``key_by`` as it was before sub-batches by target subtask: one :class:`KeyedBatch` per key group."""
    column = self.column

    def process(b):
        for kb in split_by_key_group(b, column, 128):
            out(kb)

    return process


@pytest.mark.parametrize("keyed_after", [2, 3])
def test_a_checkpoint_holding_single_key_group_sub_batches_of_the_earlier_split_still_restores(
    tmp_path, monkeypatch, keyed_after
):
    """A checkpoint taken while ``key_by`` sent one sub-batch per key group holds those records in flight: they
    are restored, re-routed on a rescale and aggregated exactly once by today's operators."""
    rows = write_input(tmp_path / "in", 1500)
    with monkeypatch.context() as m:
        m.setattr(SplitByKeyGroup, "bind", split_by_key_group_as_before)
        coord, acks = checkpoint_under_backpressure(tmp_path, 2)
    records = in_flight(coord, acks, "agg")
    assert records and all(isinstance(r, KeyedBatch) for r in records), "no old-shape sub-batch in flight"
    assert all(len(owners(r, 2)) == 1 for r in records)
    restore_and_check(tmp_path, rows, coord, acks, 2, keyed_after)


def test_a_parquet_sink_commits_each_checkpoints_batches_once(tmp_path):
    rows = write_input(tmp_path / "in", 300)
    p = Pipeline("to-parquet", parallelism=2)
    (p.source(ParquetSource(str(tmp_path / "in"), batch_rows=64, batches=True), id="src")
     .map_batches(lambda b: b.select(["k", "seq"]))
     .sink(ParquetSink(str(tmp_path / "out")), id="out"))
    coord = InMemoryCoordinator(expected_subtasks=2)  # completes checkpoints: the sink commits on completion
    ThreadedRun(p, coord.reporter, coord.events, SMALL).start().join(60)
    written = pq.read_table(tmp_path / "out").to_pylist()  # the committed part files, not .pending/.inprogress
    assert sorted(r["seq"] for r in written) == sorted(r["seq"] for r in rows)
