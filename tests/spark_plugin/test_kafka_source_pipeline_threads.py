"""Pipelines that read Kafka, every subtask a thread of this process, against a real Kafka-protocol broker (Tansu):
Kafka in, keyed state, Kafka out exactly once across a restore from an unaligned checkpoint at the same and at
another source parallelism; a partition that appears while running is read from its beginning; an empty partition
does not hold event time back; and under backpressure the runtime pauses the source's partitions in its consumer."""

from __future__ import annotations

import json
import threading
from collections import Counter, defaultdict

import pytest

from contract.events import JobStatusChanged
from spark_plugin import Pipeline
from spark_plugin.api.watermarks import WatermarkStrategy
from spark_plugin.api.windows import TumblingEventTimeWindows
from spark_plugin.connectors import CollectSink, KafkaSink, KafkaSource
from spark_plugin.network.config import NetworkConfig
from spark_plugin.testing.threads import ThreadedRun
from tests.kafka import retaken_past_tansus_race
from tests.spark_plugin.fakes import InMemoryCoordinator
from tests.spark_plugin.test_kafka_pipeline_threads import CountPerKey
from tests.spark_plugin.test_partitioned_source import source_rescaled
from tests.spark_plugin.test_restore_threads import plan_from_acks
from tests.spark_plugin.test_subtask_threads import wait_for

pytestmark = pytest.mark.kafka

SMALL = NetworkConfig(buffer_size=512)
PARTITIONS = 5
KEYS = 10


def produce_input(broker, topic: str, records) -> None:
    """``records``: (partition, key bytes, value bytes, timestamp ms or None). The last record of each partition
    goes in a batch of its own: Tansu answers a partition's end offset with its last batch's base offset plus one,
    which is the end only when that batch holds one record (``stop_at="end"`` reads up to it)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    last: dict[int, tuple] = {}
    for r in records:
        if r[0] in last:
            _produce(producer, topic, last[r[0]])
        last[r[0]] = r
    assert producer.flush(30) == 0
    for r in last.values():
        _produce(producer, topic, r)
        assert producer.flush(30) == 0


def _produce(producer, topic, record) -> None:
    partition, key, value, ts = record
    kwargs = {"timestamp": ts} if ts is not None else {}
    while True:
        try:
            producer.produce(topic, key=key, value=value, partition=partition, **kwargs)
            return
        except BufferError:
            producer.poll(0.1)


def keyed_input(count: int) -> list[tuple]:
    """Record ``seq`` of key ``seq % KEYS``, on partition ``key % PARTITIONS``: each key's records in one partition,
    in seq order (Kafka's order is per partition)."""
    return [(s % KEYS % PARTITIONS, str(s % KEYS).encode(), json.dumps([s % KEYS, s]).encode(), None)
            for s in range(count)]


def key_and_seq(r):
    return tuple(r.value)


def kafka_to_kafka(bootstrap: str, source_topic: str, sink_topic: str, source_parallelism: int) -> Pipeline:
    p = Pipeline("kafka-to-kafka", parallelism=2)
    (
        p.source(KafkaSource(bootstrap, source_topic, stop_at="end", value_deserializer="json", to_record=key_and_seq),
                 id="src", parallelism=source_parallelism)
        .key_by(lambda r: r[0])
        .process(CountPerKey(), id="count")
        .sink(KafkaSink(bootstrap, sink_topic, key=lambda r: str(r[0]), value=list), id="out")
    )
    return p


def check_topic(messages, count: int) -> None:
    """Every seq once; per key, the counts 1, 2, 3... and the seqs ascending, as a reader of the key's partition
    sees them."""
    rows = [json.loads(m.value()) for m in messages]
    seqs = sorted(seq for _, seq, _ in rows)
    assert seqs == list(range(count)), f"{len(seqs) - len(set(seqs))} duplicates, {count - len(set(seqs))} missing"
    by_key = defaultdict(list)
    for m, (key, seq, n) in zip(messages, rows, strict=True):
        assert m.key() == str(key).encode()
        by_key[key].append((n, seq))
    for key, ns in by_key.items():
        assert [n for n, _ in ns] == list(range(1, len(ns) + 1)), f"key {key}: counts out of order or repeated"
        assert [s for _, s in ns] == sorted(s for _, s in ns), f"key {key}: records out of order"


@pytest.mark.parametrize(("old", "new"), [(2, 2), (2, 3), (3, 2)])
def test_kafka_in_keyed_state_kafka_out_exactly_once_in_key_order_across_a_restore_and_a_rescale_of_the_source(
    kafka_broker, old, new
):
    def run() -> None:
        count = 4000
        source_topic = kafka_broker.create_topic(partitions=PARTITIONS)
        sink_topic = kafka_broker.create_topic(partitions=3)
        produce_input(kafka_broker, source_topic, keyed_input(count))
        job = 7000 + 10 * old + new
        first_coord = InMemoryCoordinator(expected_subtasks=old + 2)
        first = ThreadedRun(kafka_to_kafka(kafka_broker.bootstrap, source_topic, sink_topic, old), first_coord.reporter,
                            first_coord.events, SMALL, job_id=job).start()
        wait_for(lambda: first.subtask("count", 0).records_in > 500, "records to flow")
        first_coord.trigger(1, "unaligned")
        wait_for(lambda: 1 in first_coord.completed, "checkpoint 1")
        # the sinks commit checkpoint 1 when they hear of its completion: wait for that, or a loaded machine ends the
        # attempt first and the topic holds nothing yet
        sinks = [st.chain.operators[-1].sink for st in first.subtasks if st.spec.vertex == "count"]
        wait_for(lambda: not any(c <= 1 for s in sinks for c, _ in list(s.pending)), "the sinks to commit checkpoint 1")
        first_coord.publish(JobStatusChanged(status="CANCELLED"))  # the attempt ends with records past checkpoint 1
        first.join(60)
        committed = len(kafka_broker.read(sink_topic))
        assert 0 < committed < count, "checkpoint 1 committed nothing, or everything: no restore to test"
        offsets = [a["source_offsets"] for (v, _), a in first_coord.acks[1].items() if v == "src"]
        assert sum(n for o in offsets for n in o["split_positions"].values() if n) < count, "the source had read it all"

        def fetch(blob_id, start, end):
            data = first_coord.blobs[blob_id]
            return data if start is None else data[start : end + 1]

        plan = plan_from_acks(first_coord.acks[1]) if old == new else source_rescaled(first_coord.acks[1], new)
        second_coord = InMemoryCoordinator(expected_subtasks=new + 2)
        second_coord.next_id = 2
        second = ThreadedRun(
            kafka_to_kafka(kafka_broker.bootstrap, source_topic, sink_topic, new), second_coord.reporter,
            second_coord.events, SMALL, restore=plan, fetch=fetch, restore_checkpoint=1, job_id=job,
        )
        owned = [second.subtask("src", i).chain.source.partitions() for i in range(new)]
        assert sorted(s for splits in owned for s in splits) == sorted(f"{source_topic}-{q}" for q in range(PARTITIONS))
        second.start().join(120)
        check_topic(kafka_broker.output(sink_topic, count), count)

    retaken_past_tansus_race(run, f"Kafka to Kafka restored from {old} to {new} source subtasks")


class HiddenPartitions(KafkaSource):
    """A Kafka source that lists only the first ``VISIBLE["n"]`` partitions of its topic: Tansu cannot add partitions
    to a topic (no CreatePartitions), so a test shows a partition appearing by showing one more."""

    def topic_splits(self) -> list[str]:
        splits = super().topic_splits()
        return [s for s in splits if int(s.rsplit("-", 1)[1]) < VISIBLE["n"]]


VISIBLE: dict[str, int] = {}


def passthrough(key, record, state):
    return [record]


def test_a_partition_that_appears_while_running_is_read_from_its_beginning(kafka_broker):
    topic = kafka_broker.create_topic(partitions=3)
    produce_input(kafka_broker, topic, [(q, None, f"{q}/{n}".encode(), None) for q in range(3) for n in range(20)])
    VISIBLE["n"] = 2
    try:
        # start="latest": the partitions listed at the start are read from their end; the new one from its beginning
        source = HiddenPartitions(kafka_broker.bootstrap, topic, start="latest", value_deserializer="str",
                                  to_record=lambda r: r.value, discovery_interval=0.05)
        p = Pipeline("discovery", parallelism=1)
        p.source(source, id="src").key_by(lambda r: r.split("/")[0]).process(passthrough, id="pass").sink(
            CollectSink(), id="out")
        coord = InMemoryCoordinator()
        run = ThreadedRun(p, coord.reporter, coord.events, SMALL).start()
        sink = run.subtask("pass", 0).chain.operators[-1].sink
        wait_for(lambda: len(run.subtask("src", 0).chain.source.partitions()) == 2, "the first two partitions")
        produce_input(kafka_broker, topic, [(0, None, b"0/new", None)])
        wait_for(lambda: "0/new" in list(sink.records), "a record written after the start")
        VISIBLE["n"] = 3  # a partition added to the topic
        wait_for(lambda: sum(1 for r in list(sink.records) if r.startswith("2/")) == 20, "the new partition")
        coord.publish(JobStatusChanged(status="CANCELLED"))
        run.join(60)
        records = list(sink.records)
        assert [r for r in records if r.startswith("2/")] == [f"2/{n}" for n in range(20)]
        assert [r for r in records if not r.startswith("2/")] == ["0/new"]  # the first ones from their end
    finally:
        VISIBLE.clear()


def event_ts(r):
    return r.timestamp


def count_one(n, r):
    return n + 1


def test_an_empty_partition_does_not_hold_windows_back_with_kafka_timestamps_as_event_time(kafka_broker):
    topic = kafka_broker.create_topic(partitions=2)  # partition 1 stays empty
    base = 1_700_000_000_000
    records = [(0, f"k{n % 3}".encode(), b"x", base + 10 * n) for n in range(300)]
    produce_input(kafka_broker, topic, records)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(0, event_ts).with_interval(50).with_idleness(300)
    p = Pipeline("idle-kafka", parallelism=1)
    (
        p.source(KafkaSource(kafka_broker.bootstrap, topic, key_deserializer="str"), id="src", watermarks=strategy)
        .key_by(lambda r: r.key)
        .window(TumblingEventTimeWindows.of(1000))
        .aggregate(lambda: 0, count_one, id="win")
        .sink(CollectSink(), id="out")
    )
    coord = InMemoryCoordinator()
    run = ThreadedRun(p, coord.reporter, coord.events, SMALL).start()
    assert f"{topic}-1" in run.subtask("src", 0).chain.source.partitions()  # a split of its own, with a watermark
    sink = run.subtask("win", 0).chain.operators[-1].sink
    expected = Counter()
    for _, key, _, ts in records:
        if ts < base + 2000:  # the windows the records' watermark closes: event time goes up to base + 2990
            expected[(key.decode(), ts - ts % 1000)] += 1
    # the source never ends: these windows can only fire because the empty partition goes idle
    wait_for(lambda: len([r for r in list(sink.records) if r[1] < base + 2000]) >= len(expected), "windows", 60)
    coord.publish(JobStatusChanged(status="CANCELLED"))
    run.join(60)
    fired = {(k, s): c for k, s, _, c in sink.records if s < base + 2000}
    assert fired == dict(expected)


GATE = threading.Event()


def held(key, record, state):
    GATE.wait(60)  # the keyed stage takes nothing until the test opens the gate
    return [record]


def test_under_backpressure_the_consumer_fetches_ahead_for_the_paused_splits_up_to_their_buffers(kafka_broker):
    from spark_plugin.connectors.kafka_partition import BUFFERED

    topic = kafka_broker.create_topic(partitions=2)
    produce_input(kafka_broker, topic, [(n % 2, None, b"v" * 200, None) for n in range(4000)])
    GATE.clear()
    p = Pipeline("held", parallelism=1)
    (
        p.source(KafkaSource(kafka_broker.bootstrap, topic, stop_at="end"), id="src")
        .key_by(lambda r: r.partition)
        .process(held, id="held")
        .sink(CollectSink(), id="out")
    )
    coord = InMemoryCoordinator()
    run = ThreadedRun(p, coord.reporter, coord.events, SMALL).start()
    try:
        source = run.subtask("src", 0).chain.source
        reading = source.reading
        # a split's reader opens at the split's first poll: when the first batch fills the held output (a loaded
        # machine fetches more before the first poll), the other split is never polled and has no reader to pause;
        # every reader that exists must be paused, and the source with them
        wait_for(lambda: reading.paused and reading.readers and all(r.paused for r in list(reading.readers.values())),
                 "the splits to pause")
        taken = dict(source.reading.positions)
        assert sum(taken.values()) < 4000, "the runtime took every record: no backpressure"
        readers = list(source._readers.values())
        # the runtime takes nothing, but the consumer goes on fetching ahead into the paused splits' buffers (here
        # routed by the test's own fetches: the loop does not poll a paused source), up to BUFFERED records each;
        # then the partition is paused in the consumer and fetches nothing more
        wait_for(lambda: (source._fetch(), all(r.full for r in readers))[1], "the paused splits' buffers to fill")
        assert all(len(r.buffer) <= BUFFERED + source.batch for r in readers)
        held_now = [len(r.buffer) for r in readers]
        fetched = source._consumer.consume(100, timeout=1)
        assert [m for m in fetched if m.error() is None] == [], "a full split was fetched for"
        assert [len(r.buffer) for r in readers] == held_now
    finally:
        GATE.set()
    results = run.join(120)
    out = [r for res in results for r in res.outputs.get("out", {}).get("records", [])]
    assert Counter(r.partition for r in out) == {0: 2000, 1: 2000}


def test_a_completed_checkpoints_offsets_reach_the_group_through_the_runtime(kafka_broker):
    from confluent_kafka import Consumer, TopicPartition

    count = 4000
    topic = kafka_broker.create_topic(partitions=PARTITIONS)
    produce_input(kafka_broker, topic, keyed_input(count))
    group = f"monitor-{topic}"
    p = Pipeline("commit-back", parallelism=2)
    (
        p.source(KafkaSource(kafka_broker.bootstrap, topic, value_deserializer="json", to_record=key_and_seq,
                             group_id=group, commit_offsets_on_checkpoint=True), id="src")
        .key_by(lambda r: r[0])
        .process(CountPerKey(), id="count")
        .sink(CollectSink(), id="out")
    )
    coord = InMemoryCoordinator(expected_subtasks=4)
    run = ThreadedRun(p, coord.reporter, coord.events, SMALL).start()
    wait_for(lambda: run.subtask("count", 0).records_in > 500, "records to flow")
    coord.trigger(1, "unaligned")
    wait_for(lambda: 1 in coord.completed, "checkpoint 1")
    sources = [run.subtask("src", i).chain.source for i in range(2)]
    wait_for(lambda: all(s.committed_checkpoints == [1] for s in sources), "the sources to commit checkpoint 1")
    coord.publish(JobStatusChanged(status="CANCELLED"))  # the sources read on past checkpoint 1 until here
    run.join(60)
    at_1 = {s: n for (v, _), a in coord.acks[1].items() if v == "src"
            for s, n in a["source_offsets"]["split_positions"].items() if n is not None}
    assert at_1 and sum(at_1.values()) < count, "checkpoint 1 had read nothing, or everything"
    c = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": group})
    committed = c.committed([TopicPartition(topic, q) for q in range(PARTITIONS)], timeout=30)
    c.close()
    assert {f"{topic}-{tp.partition}": tp.offset for tp in committed if tp.offset >= 0} == at_1
