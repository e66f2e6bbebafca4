"""Rescaling an event-time pipeline on Spark: windowed aggregates run under backpressure until a few unaligned
checkpoints completed, then run again as the same job with the windows on 3 subtasks instead of 2 and the source
on 1 instead of 2. Window contents, timers and watermarks are redistributed by key group (the sources' partitions
by split) and the committed output equals Spark SQL's ``groupBy(window(...))`` over the same input exactly."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from client.sync import OvertakeClient
from contract.models import CheckpointConfig
from spark_plugin import Pipeline
from spark_plugin.api.watermarks import WatermarkStrategy
from spark_plugin.api.windows import TumblingEventTimeWindows
from spark_plugin.connectors import FileSink
from spark_plugin.connectors.event_sequence import EventSequenceSource
from tests.recovery.pipelines import SMALL_BUFFERS
from tests.spark_plugin.event_time_reference import flat, spark_sql_windows, zero

pytestmark = [pytest.mark.spark, pytest.mark.slow]

UNALIGNED = CheckpointConfig(interval=300, policy="unaligned", timeout=30_000, retained=100)


def ts(r):
    return r[1]


def key(r):
    return r[0]


def slow_count_and_sum(acc, record):
    time.sleep(0.0003)  # the windows are the slow stage: data is in flight at every checkpoint
    return (acc[0] + 1, acc[1] + record[3])


def events(count: int | None) -> EventSequenceSource:
    return EventSequenceSource(count=count, partitions=4, keys=24, skew=1.1, interval_ms=10, speeds=[1, 3, 1, 2],
                               disorder_ms=150)


def windowed(name: str, count: int | None, out: Path, sources: int, windows: int) -> Pipeline:
    p = Pipeline(name, parallelism=windows)
    (
        p.source(events(count), id="src", parallelism=sources,
                 watermarks=WatermarkStrategy.for_bounded_out_of_orderness(150, ts).with_interval(50))
        .key_by(key)
        .window(TumblingEventTimeWindows.of(1000))
        .aggregate(zero, slow_count_and_sum, id="win")
        .sink(FileSink(str(out)), id="out")
    )
    return p


def test_windows_rescaled_from_an_unaligned_checkpoint_equal_spark_sql(spark, coordinator, tmp_path):
    out = tmp_path / "out"
    first = windowed("evt-rescale", None, out, sources=2, windows=2).run(
        spark, coordinator.url, checkpoint=UNALIGNED, network=SMALL_BUFFERS, stop_after_checkpoints=4, finish=False
    )
    assert first.status == "checkpoint limit", first.status
    with OvertakeClient(coordinator.url) as c:
        restored = max(x.id for x in c.list_checkpoints(first.job_id, status="COMPLETED", limit=500).items)
        assert c.get_checkpoint(first.job_id, restored).persisted_data > 0, "no in-flight data in the checkpoint"
        plan = c.restore_plan(first.job_id, restored)
    reached = [n for s in plan.subtasks if s.vertex == "src"
               for n in EventSequenceSource.reached(s.source_offsets).values()]
    count = max(reached) + 1500  # the second run is bounded: every partition goes past where the checkpoint left it
    second = windowed("evt-rescale", count, out, sources=1, windows=3).run(
        spark, coordinator.url, checkpoint=UNALIGNED, network=SMALL_BUFFERS, job_id=first.job_id,
        restore_from=restored,
    )
    assert second.status == "finished"
    got = {r.vertex: (r.old_parallelism, r.new_parallelism) for r in second.restore_plan.rescaled}
    assert got == {"src": (2, 1), "win": (2, 3)}
    rows = [tuple(json.loads(line)) for f in sorted(out.glob("part-*.jsonl")) for line in f.read_text().splitlines()]
    assert flat((k, s, e, tuple(v)) for k, s, e, v in rows) == spark_sql_windows(
        spark, events(count).all_records(), size_ms=1000
    )
