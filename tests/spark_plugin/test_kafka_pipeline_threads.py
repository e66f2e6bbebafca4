"""A pipeline into the Kafka sink, every subtask a thread: an attempt that stops after an unaligned checkpoint and a
new attempt restored from it leave every input record in the topic exactly once, in order per key, for a
read_committed consumer."""

from __future__ import annotations

import json
import time
from collections import defaultdict

import pytest

from contract.events import JobStatusChanged
from spark_plugin import Pipeline
from spark_plugin.connectors import KafkaSink, SequenceSource
from spark_plugin.network.config import NetworkConfig
from spark_plugin.testing.threads import ThreadedRun
from tests.kafka import retaken_past_tansus_race
from tests.spark_plugin.fakes import InMemoryCoordinator
from tests.spark_plugin.test_restore_threads import plan_from_acks
from tests.spark_plugin.test_subtask_threads import wait_for

pytestmark = pytest.mark.kafka

KEYS = 9


class CountPerKey:
    """Slow enough for backpressure; emits ``(key, seq, n)``, n counting the key's records."""

    def __call__(self, key, record, state):
        time.sleep(0.0002)
        n = (state.value() or 0) + 1
        state.update(n)
        return [(key, record[1], n)]


def kafka_pipeline(bootstrap: str, topic: str, count: int) -> Pipeline:
    p = Pipeline("kafka", parallelism=2)
    (
        p.source(SequenceSource(count=count, keys=KEYS), id="src")
        .key_by(lambda r: r[0])
        .process(CountPerKey(), id="count")
        .sink(KafkaSink(bootstrap, topic, key=lambda r: str(r[0]), value=list), id="out")
    )
    return p


def check_topic(messages, count: int) -> None:
    """Every seq once; per key, the counts 1, 2, 3... in the order a reader of the key's partition sees them."""
    rows = [json.loads(m.value()) for m in messages]
    seqs = sorted(seq for _, seq, _ in rows)
    assert seqs == list(range(count)), (
        f"{len(seqs) - len(set(seqs))} duplicates, {count - len(set(seqs))} missing"
    )
    by_key = defaultdict(list)
    for m, (key, _, n) in zip(messages, rows, strict=True):
        assert m.key() == str(key).encode()
        by_key[key].append(n)
    for key, ns in by_key.items():
        assert ns == list(range(1, len(ns) + 1)), f"key {key}: counts out of order or repeated: {ns[:20]}..."


def test_kafka_output_is_exactly_once_in_key_order_across_a_restore_from_an_unaligned_checkpoint(kafka_broker):
    def run() -> None:
        topic = kafka_broker.create_topic(partitions=3)
        count = 4000
        net = NetworkConfig(buffer_size=512)
        first_coord = InMemoryCoordinator(expected_subtasks=4)
        first = ThreadedRun(
            kafka_pipeline(kafka_broker.bootstrap, topic, count), first_coord.reporter, first_coord.events, net,
            job_id=41,
        ).start()
        wait_for(lambda: first.subtask("count", 0).records_in > 500, "records to flow")
        first_coord.trigger(1, "unaligned")
        wait_for(lambda: 1 in first_coord.completed, "checkpoint 1")
        # the sinks commit checkpoint 1 when they hear of its completion: wait for that, or a loaded machine ends the
        # attempt first and the topic holds nothing yet
        sinks = [st.chain.operators[-1].sink for st in first.subtasks if st.spec.vertex == "count"]
        wait_for(lambda: not any(c <= 1 for s in sinks for c, _ in list(s.pending)), "the sinks to commit checkpoint 1")
        first_coord.publish(JobStatusChanged(status="CANCELLED"))  # the attempt ends with records past checkpoint 1
        first.join(60)
        committed = len(kafka_broker.read(topic))
        assert 0 < committed < count, "checkpoint 1 committed nothing, or everything: no restore to test"

        def fetch(blob_id, start, end):
            data = first_coord.blobs[blob_id]
            return data if start is None else data[start : end + 1]

        second_coord = InMemoryCoordinator(expected_subtasks=4)
        second_coord.next_id = 2
        second = ThreadedRun(
            kafka_pipeline(kafka_broker.bootstrap, topic, count), second_coord.reporter, second_coord.events, net,
            restore=plan_from_acks(first_coord.acks[1]), fetch=fetch, restore_checkpoint=1, job_id=41,
        )
        second.start().join(120)
        check_topic(kafka_broker.output(topic, count), count)

    retaken_past_tansus_race(run, "a threaded restore into the Kafka sink")
