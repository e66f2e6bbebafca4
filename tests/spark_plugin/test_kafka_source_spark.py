"""Kafka in and out on Spark: a run that stops after two unaligned checkpoints, then the same job restored from the
latest one with three source subtasks instead of two; a read_committed reader of the output topic finds every input
record once, each key's counts in order."""

from __future__ import annotations

import pytest

from client.sync import OvertakeClient
from contract.models import CheckpointConfig
from spark_plugin import Pipeline
from spark_plugin.connectors import KafkaSink, KafkaSource
from spark_plugin.network.config import NetworkConfig
from tests.kafka import retaken_past_tansus_race
from tests.spark_plugin.test_kafka_source_pipeline_threads import (
    check_topic,
    key_and_seq,
    keyed_input,
    produce_input,
)

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

UNALIGNED = CheckpointConfig(interval=300, policy="unaligned", timeout=30_000, retained=10)


def slow_count(key, record, state):
    import time

    time.sleep(0.0005)
    n = (state.value() or 0) + 1
    state.update(n)
    return [(key, record[1], n)]


def pipeline(bootstrap: str, source_topic: str, sink_topic: str, source_parallelism: int) -> Pipeline:
    p = Pipeline("kafka-spark", parallelism=2)
    (
        p.source(KafkaSource(bootstrap, source_topic, stop_at="end", value_deserializer="json", to_record=key_and_seq),
                 id="src", parallelism=source_parallelism)
        .key_by(lambda r: r[0])
        .process(slow_count, id="count")
        .sink(KafkaSink(bootstrap, sink_topic, key=lambda r: str(r[0]), value=list), id="out")
    )
    return p


def test_kafka_to_kafka_on_spark_restored_with_more_source_subtasks_is_exactly_once(spark, coordinator, kafka_broker):
    count = 20_000
    net = NetworkConfig(buffer_size=1024)

    def run():
        source_topic = kafka_broker.create_topic(partitions=5)
        sink_topic = kafka_broker.create_topic(partitions=3)
        produce_input(kafka_broker, source_topic, keyed_input(count))
        first = pipeline(kafka_broker.bootstrap, source_topic, sink_topic, 2).run(
            spark, coordinator.url, checkpoint=UNALIGNED, network=net, stop_after_checkpoints=2, finish=False
        )
        assert first.status == "checkpoint limit", first.status
        committed = len(kafka_broker.read(sink_topic))
        assert committed < count, "the first run committed everything: no restore to test"
        second = pipeline(kafka_broker.bootstrap, source_topic, sink_topic, 3).run(
            spark, coordinator.url, checkpoint=UNALIGNED, network=net, job_id=first.job_id, restore_from="latest"
        )
        return sink_topic, first, second

    sink_topic, first, second = retaken_past_tansus_race(run, "Kafka to Kafka restored with more source subtasks")
    assert second.status == "finished", second.status
    with OvertakeClient(coordinator.url) as client:
        attempts = [e.data for e in client.event_history(first.job_id, limit=1000) if e.type.value == "attempt.started"]
    assert {r["vertex"]: (r["old_parallelism"], r["new_parallelism"]) for r in attempts[-1]["rescaled"]} == {
        "src": (2, 3)
    }
    check_topic(kafka_broker.output(sink_topic, count), count)
