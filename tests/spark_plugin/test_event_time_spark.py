"""Windowed aggregates on local Spark with the real coordinator equal, exactly, what Spark SQL computes with
``groupBy(window(...))`` over the same input as a batch DataFrame: out-of-order input (within the watermark's
bound), skewed keys, partitions whose event time runs at different speeds, an idle partition, checkpoints taken
unaligned throughout."""

from __future__ import annotations

import pytest

from contract.models import CheckpointConfig
from spark_plugin import Pipeline
from spark_plugin.api.watermarks import WatermarkStrategy
from spark_plugin.api.windows import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
)
from spark_plugin.connectors import CollectSink
from spark_plugin.connectors.event_sequence import EventSequenceSource
from spark_plugin.network.config import NetworkConfig
from tests.spark_plugin.event_time_reference import count_and_sum, flat, merge, spark_sql_windows, zero

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SMALL = NetworkConfig(buffer_size=2048)
CHECKPOINTS = CheckpointConfig(interval=300, policy="unaligned", retained=3, timeout=60_000)


def ts(r):
    return r[1]


def key(r):
    return r[0]


def test_tumbling_windows_over_skewed_partitions_equal_spark_sql(spark, coordinator):
    # six partitions over two source subtasks, event time at up to 4x the speed of the slowest, one partition idle:
    # a watermark per source subtask instead of per partition would make the slow partitions' records late
    src = EventSequenceSource(count=1500, partitions=6, keys=40, skew=1.2, interval_ms=10,
                              speeds=[1, 1, 2, 3, 4, 1], disorder_ms=300, idle=[5])
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(300, ts).with_idleness(500).with_interval(50)
    p = Pipeline("evt-tumbling", parallelism=2)
    (
        p.source(src, id="events", watermarks=strategy)
        .key_by(key)
        .window(TumblingEventTimeWindows.of(1000))
        .aggregate(zero, count_and_sum, id="per-second")
        .sink(CollectSink(), id="out")
    )
    result = p.run(spark, coordinator.url, checkpoint=CHECKPOINTS, network=SMALL)
    assert result.status == "finished"
    assert flat(result.outputs("out")) == spark_sql_windows(spark, src.all_records(), size_ms=1000)


def test_sliding_and_session_windows_equal_spark_sql(spark, coordinator):
    src = EventSequenceSource(count=1200, partitions=4, keys=30, skew=1.0, interval_ms=10, speeds=[1, 2, 1, 3],
                              disorder_ms=150)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(150, ts).with_interval(50)
    p = Pipeline("evt-sliding-session", parallelism=1)
    events = p.source(src, id="events", watermarks=strategy)
    (
        events.key_by(key)
        .window(SlidingEventTimeWindows.of(2000, 500))
        .aggregate(zero, count_and_sum, id="sliding")
        .sink(CollectSink(), id="sliding-out")
    )
    (
        events.key_by(key)
        .window(EventTimeSessionWindows.with_gap(400))
        .aggregate(zero, count_and_sum, merge=merge, id="sessions")
        .sink(CollectSink(), id="sessions-out")
    )
    result = p.run(spark, coordinator.url, checkpoint=CHECKPOINTS, network=SMALL)
    assert result.status == "finished"
    records = src.all_records()
    assert flat(result.outputs("sliding-out")) == spark_sql_windows(spark, records, size_ms=2000, slide_ms=500)
    sessions = flat(result.outputs("sessions-out"))
    assert sessions == spark_sql_windows(spark, records, gap_ms=400)
    assert any(e - s > 2 * 400 for _, s, e, _, _ in sessions), "no session merged several records"
