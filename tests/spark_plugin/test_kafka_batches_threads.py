"""The Kafka source's batch form, every subtask a thread, against a real Kafka-protocol broker (Tansu): each poll of
a partition is one Arrow record batch of its records, the fields of JSON values as columns; every message arrives
once, also across a restore from an unaligned checkpoint at the same and at another source parallelism; a value
column keys the stream, and the Kafka timestamp column drives event-time windows."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict

import pyarrow as pa
import pytest

from contract.events import JobStatusChanged
from spark_plugin import Pipeline
from spark_plugin.api.watermarks import WatermarkStrategy
from spark_plugin.api.windows import TumblingEventTimeWindows
from spark_plugin.connectors import CollectSink, KafkaRecord, KafkaSource
from spark_plugin.connectors.kafka_records import record_batch
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.fakes import InMemoryCoordinator, sample_until
from tests.spark_plugin.test_kafka_source_pipeline_threads import SMALL, produce_input
from tests.spark_plugin.test_partitioned_source import source_rescaled
from tests.spark_plugin.test_restore_threads import plan_from_acks
from tests.spark_plugin.test_subtask_threads import wait_for

pytestmark = pytest.mark.kafka

PARTITIONS = 5
CUSTOMERS = 10


def order(n: int) -> dict:
    return {"customer": f"c{n % CUSTOMERS}", "amount": n % 17, "seq": n}


def orders(count: int, base_ts: int | None = None) -> list[tuple]:
    """Order ``n`` on partition ``n % PARTITIONS`` (a customer's orders all in one partition), keyed by its customer."""
    return [(n % PARTITIONS, order(n)["customer"].encode(), json.dumps(order(n)).encode(),
             None if base_ts is None else base_ts + 10 * n) for n in range(count)]


def source(bootstrap: str, topic: str, **kw) -> KafkaSource:
    return KafkaSource(bootstrap, topic, value_deserializer="json", key_deserializer="str", batches=True,
                       value_columns=True, **kw)


def test_each_batch_holds_up_to_batch_rows_records_of_one_partition_and_every_message_arrives_once(kafka_broker):
    count = 1500
    topic = kafka_broker.create_topic(partitions=PARTITIONS)
    produce_input(kafka_broker, topic, orders(count))
    p = Pipeline("kafka-batches", parallelism=2)
    p.source(source(kafka_broker.bootstrap, topic, batch_rows=64, stop_at="end"), id="src").sink(CollectSink(),
                                                                                               id="out")
    coord = InMemoryCoordinator()
    results = ThreadedRun(p, coord.reporter, coord.events, SMALL).start().join(60)
    batches = [b for res in results for b in res.outputs["out"]["records"]]
    assert all(b.schema.names == ["customer", "amount", "seq", "key", "topic", "partition", "offset", "timestamp"]
               for b in batches)
    assert all(0 < b.num_rows <= 64 for b in batches) and max(b.num_rows for b in batches) > 1
    assert all(len(set(b.column("partition").to_pylist())) == 1 for b in batches), "a batch spans partitions"
    rows = [r for b in batches for r in b.to_pylist()]
    assert sorted(r["seq"] for r in rows) == list(range(count)), "a message lost or repeated"
    for r in rows:
        assert {k: r[k] for k in ("customer", "amount", "seq")} == order(r["seq"])
        assert r["key"] == r["customer"] and r["topic"] == topic and r["partition"] == r["seq"] % PARTITIONS
    by_partition = defaultdict(list)
    for r in rows:
        by_partition[r["partition"]].append(r["offset"])
    assert all(offsets == list(range(len(offsets))) for offsets in by_partition.values()), "offsets out of order"


def slow(batch):
    time.sleep(0.01)  # per sub-batch's aggregates: backpressure on the keyed edge
    return batch


def spend(bootstrap: str, topic: str, source_parallelism: int) -> Pipeline:
    p = Pipeline("kafka-spend", parallelism=2)
    (
        p.source(source(bootstrap, topic, batch_rows=20, stop_at="end"), id="src", parallelism=source_parallelism)
        .key_by("customer")
        .aggregate({"amount": ["sum", "count"]}, id="agg")
        .map_batches(slow, id="slow")  # backpressure on the keyed edge: sub-batches in flight in the checkpoint
        .rows(id="rows")
        .sink(CollectSink(), id="out")
    )
    return p


def expected_spend(count: int) -> dict:
    out: dict = defaultdict(lambda: {"amount_sum": 0, "amount_count": 0})
    for n in range(count):
        o = order(n)
        out[o["customer"]]["amount_sum"] += o["amount"]
        out[o["customer"]]["amount_count"] += 1
    return dict(out)


def finals(results) -> tuple[dict, dict]:
    last, counts = {}, defaultdict(list)
    for res in results:
        for row in res.outputs.get("out", {}).get("records", []):
            last[row["customer"]] = {"amount_sum": row["amount_sum"], "amount_count": row["amount_count"]}
            counts[row["customer"]].append(row["amount_count"])
    return last, counts


def checkpoint_under_backpressure(kafka_broker, topic: str, old: int, count: int, tries: int = 4):
    """Run the pipeline, take unaligned checkpoint 1 while sub-batches are queued, and stop there; taken again
    (``sample_until``) when a try's checkpoint held no queued sub-batch or was not mid-stream."""

    def take():
        coord = InMemoryCoordinator(expected_subtasks=old + 2)
        run = ThreadedRun(spend(kafka_broker.bootstrap, topic, old), coord.reporter, coord.events, SMALL).start()
        wait_for(lambda: run.subtask("agg", 0).records_in > 20, "sub-batches to flow")
        coord.trigger(1, "unaligned")
        wait_for(lambda: 1 in coord.completed, "checkpoint 1")
        coord.publish(JobStatusChanged(status="CANCELLED"))
        run.join(60)
        return coord, coord.acks[1]

    def why_not(sample):
        _, acks = sample
        taken = sum(n for (v, _), a in acks.items() if v == "src"
                    for n in a["source_offsets"]["split_positions"].values() if n)
        queued = sum(1 for k, p in plan_from_acks(acks).items() if k[0] == "agg" and p["input_channel_state"])
        return None if 0 < taken < count and queued else {"read": taken, "agg subtasks with input in flight": queued}

    return sample_until(take, why_not, "unaligned checkpoint mid-stream under backpressure", tries)


@pytest.mark.parametrize(("old", "new"), [(2, 2), (2, 3)])
def test_keyed_by_a_value_column_a_restore_of_an_unaligned_checkpoint_counts_every_message_once(kafka_broker, old,
                                                                                                  new):
    count = 6000
    topic = kafka_broker.create_topic(partitions=PARTITIONS)
    produce_input(kafka_broker, topic, orders(count))
    first_coord, acks = checkpoint_under_backpressure(kafka_broker, topic, old, count)
    same = plan_from_acks(acks)

    def fetch(blob_id, start, end):
        data = first_coord.blobs[blob_id]
        return data if start is None else data[start : end + 1]

    second_coord = InMemoryCoordinator(expected_subtasks=new + 2)
    second_coord.next_id = 2
    second = ThreadedRun(spend(kafka_broker.bootstrap, topic, new), second_coord.reporter, second_coord.events, SMALL,
                         restore=same if old == new else source_rescaled(acks, new), fetch=fetch,
                         restore_checkpoint=1)
    last, counts = finals(second.start().join(120))
    want = expected_spend(count)
    # a customer whose every order was counted before the checkpoint sends nothing after it; the others end exactly
    assert last and {k: v for k, v in want.items() if k in last} == last
    assert all(c == sorted(c) and len(c) == len(set(c)) for c in counts.values()), "a count went back or repeated"


def test_the_kafka_timestamp_column_gives_batches_event_time_for_windows(kafka_broker):
    topic = kafka_broker.create_topic(partitions=2)
    base = 1_700_000_000_000
    records = [(n % 2, None, json.dumps(order(n)).encode(), base + 10 * n) for n in range(300)]
    produce_input(kafka_broker, topic, records)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(0, timestamp="timestamp").with_interval(50)
    p = Pipeline("kafka-batch-windows", parallelism=1)
    (
        p.source(source(kafka_broker.bootstrap, topic, batch_rows=25), id="src", watermarks=strategy)
        .key_by("customer")
        .window(TumblingEventTimeWindows.of(1000))
        .aggregate({"amount": "count"}, id="win")
        .rows(id="rows")
        .sink(CollectSink(), id="out")
    )
    coord = InMemoryCoordinator()
    run = ThreadedRun(p, coord.reporter, coord.events, SMALL).start()
    sink = run.subtask("win", 0).chain.operators[-1].sink
    expected = Counter()
    for n in range(300):
        if base + 10 * n < base + 2000:  # the windows the watermark closes: event time goes up to base + 2990
            expected[(order(n)["customer"], base + 10 * n - (10 * n) % 1000)] += 1
    # the source never ends: these windows fire only as the timestamp column's watermark passes them
    wait_for(lambda: len([r for r in list(sink.records) if r["window_start"] < base + 2000]) >= len(expected),
             "windows", 60)
    coord.publish(JobStatusChanged(status="CANCELLED"))
    run.join(60)
    fired = {(r["customer"], r["window_start"]): r["amount_count"] for r in sink.records
             if r["window_start"] < base + 2000}
    assert fired == dict(expected)


def kafka_record(offset: int, value) -> KafkaRecord:
    return KafkaRecord("t", 0, offset, b"k", value, (("h", b"v"),), 1_700_000_000_000 + offset)


def test_a_value_schema_types_the_value_columns_and_headers_come_as_spark_gives_them():
    schema = pa.schema([("customer", pa.string()), ("amount", pa.float64())])
    batch = record_batch([kafka_record(0, {"customer": "c1", "amount": 2}), kafka_record(1, None)],
                         key_type=pa.binary(), value_columns=True, value_schema=schema, include_headers=True)
    assert batch.schema.field("amount").type == pa.float64()
    assert batch.to_pylist()[1] == {"customer": None, "amount": None, "key": b"k", "topic": "t", "partition": 0,
                                    "offset": 1, "timestamp": 1_700_000_000_001,
                                    "headers": [{"key": "h", "value": b"v"}]}


def test_value_columns_refuse_a_field_named_like_a_kafka_column_and_a_value_that_is_no_object():
    with pytest.raises(ValueError, match="field 'timestamp'"):
        record_batch([kafka_record(0, {"timestamp": 5})], value_columns=True)
    with pytest.raises(ValueError, match="offset 1 of t-0 is list"):
        record_batch([kafka_record(0, {"a": 1}), kafka_record(1, [1])], value_columns=True)


def test_the_options_that_shape_batches_need_batches_true():
    with pytest.raises(ValueError, match="need batches=True"):
        KafkaSource("localhost:9092", "t", value_columns=True)
    with pytest.raises(ValueError, match="choose one"):
        KafkaSource("localhost:9092", "t", batches=True, to_record=lambda r: r)
    with pytest.raises(ValueError, match="batch_rows 0"):
        KafkaSource("localhost:9092", "t", batches=True, batch_rows=0)
