"""Killed subtask processes with the Kafka sink: SIGKILL a random subtask's Python worker several times in one
run under unaligned checkpoints and backpressure; a read_committed consumer of the output topic then reads every
input record exactly once, in order per key.

On the Tansu test broker a kill that lands inside the few milliseconds of a commit transaction leaves that
transaction open (a real Kafka aborts it when the next attempt initializes the same transactional id): the last
stable offset stays at its first record, and read uncommitted its records show beside the next attempt's commit of
the same checkpoint. ``KafkaBroker.output`` then takes out exactly those earlier copies past the stuck offset, and
nothing a read_committed reader saw (seen once in a CI run: 1,973 such copies of one transaction).
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from spark_plugin.connectors import KafkaSink
from tests.kafka import retaken_past_tansus_race
from tests.recovery.pipelines import check_exactly_once
from tests.recovery.test_subtask_failures import COUNT, run_with_kills

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]


def test_killed_subtasks_leave_kafka_output_exactly_once_in_key_order_unaligned(
    spark, coordinator, kafka_broker, tmp_path
):
    def run():
        topic = kafka_broker.create_topic(partitions=3)
        # a 10 s bound on the marker read-back: a run that met the race fails each restart sooner
        sink = KafkaSink(kafka_broker.bootstrap, topic, key=lambda r: str(r[0]), value=list, timeout=10)
        pids = tmp_path / f"pids-{topic}"
        return topic, run_with_kills(spark, coordinator, "kill-kafka", "unaligned", sink, pids, 13, COUNT)

    topic, result = retaken_past_tansus_race(run, "SIGKILLs with the Kafka sink")
    assert any(r.restored is not None for r in result.restarts), "no restart restored a checkpoint"
    messages = kafka_broker.output(topic, COUNT)  # read_committed, past Tansu's stuck last stable offset
    rows = [tuple(json.loads(m.value())) for m in messages]
    check_exactly_once(rows, COUNT)
    by_key = defaultdict(list)  # in the order a reader of each partition sees them
    for m, (key, _, n) in zip(messages, rows, strict=True):
        assert m.key() == str(key).encode()
        by_key[key].append(n)
    for key, ns in by_key.items():
        assert ns == sorted(ns), f"key {key}: the topic holds its records out of order"
