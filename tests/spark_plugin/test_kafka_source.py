"""The Kafka source against a real Kafka-protocol broker, driven through the Source API as the runtime drives it
(open, poll, pause, offsets, restore, completions): where partitions start, what a record carries, pausing under
backpressure, offsets committed back for monitoring, and clear errors."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from spark_plugin.connectors.kafka_source import KafkaRecord, KafkaSource, KafkaSourceError
from tests.live import free_port

pytestmark = pytest.mark.kafka


def produce(broker, topic: str, records) -> None:
    """``records``: (partition, key, value, timestamp ms) tuples, produced in order and acknowledged."""
    from confluent_kafka import Producer

    # one record per batch: Tansu answers a partition's end offset (ListOffsets "latest") with the base offset of its
    # last batch plus one, which is the end only when every batch holds one record
    producer = Producer({"bootstrap.servers": broker.bootstrap, "batch.num.messages": 1, "linger.ms": 0})
    for partition, key, value, ts in records:
        producer.produce(topic, key=key, value=value, partition=partition, timestamp=ts,
                         headers=[("n", str(value).encode())])
    assert producer.flush(30) == 0


def read_all(source: KafkaSource, limit: float = 60.0) -> list:
    """Poll a bounded source (``stop_at="end"``) until it ends."""
    out: list = []
    deadline = time.monotonic() + limit
    while (batch := source.poll(50)) is not None:
        assert time.monotonic() < deadline, f"the source did not end; read {len(out)}"
        out += batch
        if not batch:
            time.sleep(0.01)
    return out


OPENED: list[KafkaSource] = []


@pytest.fixture(autouse=True)
def release_sources():
    """Release every source a test opened, as a subtask's end does: no consumer outlives its test."""
    yield
    while OPENED:
        OPENED.pop().release()


def opened(source: KafkaSource, subtask: int = 0, parallelism: int = 1) -> KafkaSource:
    OPENED.append(source)
    source.open(subtask, parallelism)
    return source


def values(records) -> list:
    return [(r.partition, r.value) for r in records]


@pytest.fixture
def two_partitions(kafka_broker):
    """A topic of two partitions with five records each: values 0..9, value v on partition v % 2 at 1000 + 100 v ms."""
    topic = kafka_broker.create_topic(partitions=2)
    produce(kafka_broker, topic, [(v % 2, f"k{v}".encode(), str(v).encode(), 1000 + 100 * v) for v in range(10)])
    return topic


def test_from_earliest_every_record_of_every_partition_is_read_once_in_offset_order(kafka_broker, two_partitions):
    src = opened(KafkaSource(kafka_broker.bootstrap, two_partitions, stop_at="end"))
    got = read_all(src)
    src.close()
    assert sorted(values(got)) == sorted((v % 2, str(v).encode()) for v in range(10))
    for p in (0, 1):
        assert [r.offset for r in got if r.partition == p] == list(range(5))


def test_a_record_carries_its_topic_partition_offset_key_headers_and_kafka_timestamp(kafka_broker, two_partitions):
    src = opened(KafkaSource(kafka_broker.bootstrap, two_partitions, stop_at="end", key_deserializer="str",
                             value_deserializer=int))
    got = {r.value: r for r in read_all(src)}
    src.close()
    assert got[3] == KafkaRecord(topic=two_partitions, partition=1, offset=1, key="k3", value=3,
                                 headers=(("n", b"b'3'"),), timestamp=1300)


def test_json_values_and_a_to_record_function(kafka_broker):
    topic = kafka_broker.create_topic(partitions=1)
    produce(kafka_broker, topic, [(0, None, json.dumps({"id": i}).encode(), 5000 + i) for i in range(3)])
    src = opened(KafkaSource(kafka_broker.bootstrap, topic, stop_at="end", value_deserializer="json",
                             to_record=lambda r: (r.value["id"], r.timestamp, r.key)))
    assert read_all(src) == [(0, 5000, None), (1, 5001, None), (2, 5002, None)]
    src.close()


def test_from_latest_only_records_written_after_the_start_are_read(kafka_broker, two_partitions):
    src = opened(KafkaSource(kafka_broker.bootstrap, two_partitions, start="latest"))
    assert src.poll(50) == []  # opens the readers at the end of each partition
    produce(kafka_broker, two_partitions, [(0, None, b"new-0", 9000), (1, None, b"new-1", 9001)])
    got: list = []
    deadline = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < deadline:
        got += src.poll(50) or []
    src.close()
    assert sorted(values(got)) == [(0, b"new-0"), (1, b"new-1")]


def test_a_checkpoint_before_any_read_holds_where_latest_started_so_a_restore_reads_what_came_since(
    kafka_broker, two_partitions
):
    src = opened(KafkaSource(kafka_broker.bootstrap, two_partitions, start="latest"))
    offsets = src.offsets()  # a checkpoint before the first poll
    src.close()
    assert offsets["split_positions"] == {f"{two_partitions}-0": 5, f"{two_partitions}-1": 5}
    produce(kafka_broker, two_partitions, [(0, None, b"after", 9000)])
    again = opened(KafkaSource(kafka_broker.bootstrap, two_partitions, start="latest"))
    again.restore_positions([offsets])
    got: list = []
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        got += again.poll(50) or []
    again.close()
    assert [r.value for r in got] == [b"after"]


def test_from_a_timestamp_each_partition_starts_at_its_first_record_at_or_after_it(kafka_broker, two_partitions):
    src = opened(KafkaSource(kafka_broker.bootstrap, two_partitions, start=1500, stop_at="end"))
    got = read_all(src)
    src.close()
    assert sorted(r.timestamp for r in got) == [1500, 1600, 1700, 1800, 1900]


def test_from_a_timestamp_a_record_after_the_first_one_at_it_is_read_even_when_older(kafka_broker):
    topic = kafka_broker.create_topic(partitions=1)
    produce(kafka_broker, topic, [(0, None, b"a", 1000), (0, None, b"b", 2000), (0, None, b"c", 1500)])
    src = opened(KafkaSource(kafka_broker.bootstrap, topic, start=1800, stop_at="end"))
    assert [r.value for r in read_all(src)] == [b"b", b"c"]  # Kafka's rule: from the first offset at 1800 on
    src.close()


def test_from_the_groups_committed_offsets_and_earliest_where_it_has_none(kafka_broker, two_partitions):
    from confluent_kafka import Consumer, TopicPartition

    group = f"g-{uuid.uuid4().hex[:8]}"
    c = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": group})
    c.commit(offsets=[TopicPartition(two_partitions, 0, 3)], asynchronous=False)  # partition 1: nothing committed
    c.close()
    src = opened(KafkaSource(kafka_broker.bootstrap, two_partitions, start="committed", group_id=group, stop_at="end"))
    got = read_all(src)
    src.close()
    assert sorted(values(got)) == sorted([(0, b"6"), (0, b"8")] + [(1, str(v).encode()) for v in (1, 3, 5, 7, 9)])


def test_positions_are_next_offsets_of_what_the_runtime_took_and_a_restore_goes_on_from_them(
    kafka_broker, two_partitions
):
    src = opened(KafkaSource(kafka_broker.bootstrap, two_partitions, stop_at="end"))
    first: list = []
    while len(first) < 3:
        first += src.poll(3)  # one split's batch at a time, round robin
    positions = src.offsets()["split_positions"]
    taken = {p: max(r.offset for r in first if r.partition == p) + 1 for p in {r.partition for r in first}}
    assert {s: n for s, n in positions.items() if n is not None and int(s.rsplit("-", 1)[1]) in taken} == {
        f"{two_partitions}-{p}": n for p, n in taken.items()
    }  # what was fetched beyond the records taken does not count
    src.close()
    again = opened(KafkaSource(kafka_broker.bootstrap, two_partitions, stop_at="end"))
    again.restore_positions([src.offsets()])
    rest = read_all(again)
    again.close()
    assert sorted(values(first + rest)) == sorted((v % 2, str(v).encode()) for v in range(10))


def test_lag_is_records_behind_the_partitions_end(kafka_broker, two_partitions):
    src = opened(KafkaSource(kafka_broker.bootstrap, two_partitions))
    got: list = []
    deadline = time.monotonic() + 30
    while len(got) < 10 and time.monotonic() < deadline:
        got += src.poll(3) or []
    lag = src.lag()
    src.close()
    assert lag == {f"{two_partitions}-0": 0, f"{two_partitions}-1": 0}
    src = opened(KafkaSource(kafka_broker.bootstrap, two_partitions))
    got = []
    while not got:
        got = src.poll(2) or []
    lag = src.lag()
    live = {s["split"]: s for s in src.split_metrics(100)["splits"]}  # what the subtask's live metrics carry
    src.close()
    p = got[0].partition
    assert lag[f"{two_partitions}-{p}"] == 3  # 5 records, 2 taken (once the consumer saw the partition's end)
    assert live[f"{two_partitions}-{p}"]["lag"] == 3 and live[f"{two_partitions}-{p}"]["position"] == str(
        max(r.offset for r in got) + 1
    )


def test_a_split_paused_by_backpressure_keeps_fetching_ahead_and_hands_its_records_out_at_once_on_resume(
    kafka_broker,
):
    # pausing the partition in the consumer would drop what it fetched ahead, and the resume would wait a fetch
    topic = kafka_broker.create_topic(partitions=1)
    produce(kafka_broker, topic, [(0, None, b"before", 1000)])
    src = opened(KafkaSource(kafka_broker.bootstrap, topic))
    got: list = []
    while not got:
        got = src.poll(10) or []
    (reader,) = src._readers.values()
    src.pause()  # the runtime's output is full: it takes nothing
    produce(kafka_broker, topic, [(0, None, f"while-paused-{i}".encode(), 2000 + i) for i in range(5)])
    deadline = time.monotonic() + 30
    while len(reader.buffer) < 5:  # what another split's poll routes here: the consumer went on fetching
        assert time.monotonic() < deadline, "the paused split fetched nothing ahead"
        src._fetch()
        time.sleep(0.01)
    assert not reader.full
    src.resume()
    got += src.poll(10) or []  # one poll, no wait for a fetch
    assert [r.value for r in got] == [b"before"] + [f"while-paused-{i}".encode() for i in range(5)]


def test_a_paused_split_stops_fetching_once_its_buffer_is_full_and_resumes_when_it_is_taken(kafka_broker):
    from spark_plugin.connectors import kafka_partition

    topic = kafka_broker.create_topic(partitions=1)
    src = opened(KafkaSource(kafka_broker.bootstrap, topic))
    assert src.poll(10) in ([], None)
    (reader,) = src._readers.values()
    paused_in_consumer = []
    real = src._set_paused
    src._set_paused = lambda r, paused: (paused_in_consumer.append(paused), real(r, paused))
    src.pause()
    assert paused_in_consumer == []  # backpressure alone does not pause the partition in the consumer
    old, kafka_partition.BUFFERED = kafka_partition.BUFFERED, 3
    try:
        produce(kafka_broker, topic, [(0, None, f"r{i}".encode(), 1000 + i) for i in range(5)])
        deadline = time.monotonic() + 30
        while not reader.full:
            assert time.monotonic() < deadline, "the split's buffer never filled"
            src._fetch()
            time.sleep(0.01)
        assert paused_in_consumer == [True]  # full: now the partition is paused in the consumer
        src.resume()
        taken = src.poll(10) or []
        while reader.buffer:
            taken += src.poll(10) or []
        assert paused_in_consumer == [True, False]  # emptied: fetching again
    finally:
        kafka_partition.BUFFERED = old
    while len(taken) < 5:
        assert time.monotonic() < deadline, f"read {len(taken)} of 5"
        taken += src.poll(10) or []
    assert [r.value for r in taken] == [f"r{i}".encode() for i in range(5)]


def test_on_completion_a_checkpoints_offsets_are_committed_to_the_group_for_monitoring(kafka_broker, two_partitions):
    from confluent_kafka import Consumer, TopicPartition

    group = f"g-{uuid.uuid4().hex[:8]}"
    src = opened(KafkaSource(kafka_broker.bootstrap, two_partitions, group_id=group,
                             commit_offsets_on_checkpoint=True))
    got: list = []
    while len(got) < 4:
        got += src.poll(2) or []
    src.snapshot_started(1)
    at_1 = src.offsets()["split_positions"]
    while len(got) < 10:
        got += src.poll(2) or []  # read on past checkpoint 1
    src.notify_checkpoint_complete(1)
    src.close()  # a consumer closes after its asynchronous commits went out
    c = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": group})
    committed = c.committed([TopicPartition(two_partitions, p) for p in (0, 1)], timeout=30)
    c.close()
    want = {int(s.rsplit("-", 1)[1]): n for s, n in at_1.items() if n is not None}
    assert {tp.partition: tp.offset for tp in committed if tp.offset >= 0} == want
    assert src.committed_checkpoints == [1]


def test_a_missing_topic_fails_naming_the_topic_and_the_broker(kafka_broker):
    src = KafkaSource(kafka_broker.bootstrap, "no-such-topic-here", timeout=10)
    with pytest.raises(KafkaSourceError, match=r"topic 'no-such-topic-here' does not exist") as e:
        src.open(0, 1)
    assert kafka_broker.bootstrap in str(e.value)
    src.close()


class Unreachable:
    """A consumer whose metadata requests fail as when the brokers are gone; everything else goes through."""

    def __init__(self, consumer) -> None:
        self.consumer = consumer

    def list_topics(self, *args, **kwargs):
        from confluent_kafka import KafkaError, KafkaException

        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "brokers gone"))

    def __getattr__(self, name):
        return getattr(self.consumer, name)


def test_a_failed_listing_while_running_keeps_reading_the_known_partitions(kafka_broker, two_partitions, caplog):
    src = opened(KafkaSource(kafka_broker.bootstrap, two_partitions, discovery_interval=0.01))
    consumer = src._consumer
    src._consumer = Unreachable(consumer)  # every discovery from now on fails
    got: list = []
    deadline = time.monotonic() + 30
    with caplog.at_level("WARNING", logger="spark_plugin.connectors.kafka_source"):
        while len(got) < 10 and time.monotonic() < deadline:
            got += src.poll(50) or []
            time.sleep(0.01)
    src._consumer = consumer
    src.close()
    assert sorted(values(got)) == sorted((v % 2, str(v).encode()) for v in range(10))
    assert "listing the partitions again failed" in caplog.text and "brokers gone" in caplog.text


def test_an_unreachable_broker_fails_within_the_timeout_naming_the_broker():
    bootstrap = f"127.0.0.1:{free_port()}"  # nothing listens there
    src = KafkaSource(bootstrap, "orders", timeout=3)
    with pytest.raises(KafkaSourceError, match="did not answer within 3") as e:
        src.open(0, 1)
    assert bootstrap in str(e.value) and "'orders'" in str(e.value)
    src.close()


def test_a_record_the_deserializer_refuses_fails_naming_its_partition_and_offset(kafka_broker):
    topic = kafka_broker.create_topic(partitions=1)
    produce(kafka_broker, topic, [(0, None, b"{}", 1000), (0, None, b"not json", 1001)])
    src = opened(KafkaSource(kafka_broker.bootstrap, topic, stop_at="end", value_deserializer="json"))
    with pytest.raises(KafkaSourceError, match=rf"offset 1 of {topic}-0 .*not json.*JSONDecodeError"):
        read_all(src)
    src.close()


def test_invalid_settings_are_refused_naming_the_setting():
    with pytest.raises(ValueError, match="start 'beginning'"):
        KafkaSource("k:9092", "t", start="beginning")
    with pytest.raises(ValueError, match="need a group_id"):
        KafkaSource("k:9092", "t", commit_offsets_on_checkpoint=True)
    with pytest.raises(ValueError, match="value_deserializer 'xml'"):
        KafkaSource("k:9092", "t", value_deserializer="xml")
