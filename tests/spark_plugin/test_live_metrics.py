"""A subtask's live metrics: rates, backpressure and the watermark once a second, sent off the loop, never waiting
for the coordinator; and, end to end, what the coordinator shows of a backpressured pipeline's subtasks and of an
event-time pipeline's watermarks."""

from __future__ import annotations

import threading
import time

import pytest

from client.sync import OvertakeClient
from spark_plugin import Pipeline
from spark_plugin.api.watermarks import MAX_WATERMARK, WatermarkStrategy
from spark_plugin.api.windows import TumblingEventTimeWindows
from spark_plugin.connectors import CollectSink, DiscardSink, SequenceSource
from spark_plugin.connectors.event_sequence import EventSequenceSource
from spark_plugin.network.config import NetworkConfig
from spark_plugin.task.metrics import LiveMetrics, watermark_sample
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.fakes import InMemoryCoordinator


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def collecting():
    sent: list[dict] = []
    got = threading.Semaphore(0)

    def send(sample, timestamp):
        sent.append(sample | {"timestamp": timestamp})
        got.release()

    return sent, got, send


def test_a_sample_is_taken_once_an_interval_passed_with_the_rates_of_that_window():
    clock = Clock()
    sent, got, send = collecting()
    live = LiveMetrics(send, interval=1.0, clock=clock)
    clock.t += 0.5
    live.tick(records_in=100, bytes_in=1000, bytes_out=500)
    clock.t += 1.5
    live.blocked(0.5)
    live.tick(records_in=400, bytes_in=4000, bytes_out=2000)
    assert got.acquire(timeout=10)
    live.close()
    (sample,) = sent
    assert sample["window_ms"] == 2000
    assert sample["records_in_per_second"] == 200.0 and sample["bytes_in_per_second"] == 2000.0
    assert sample["bytes_out_per_second"] == 1000.0 and sample["backpressure"] == 0.25
    assert sample["records_in"] == 400 and sample["timestamp"] > 0


def test_a_sample_carries_the_watermark_and_its_lag_at_the_time_it_was_taken():
    clock = Clock()
    sent, got, send = collecting()
    live = LiveMetrics(send, interval=1.0, clock=clock, watermark=lambda: (1_700_000_000_000, False))
    clock.t += 1
    live.tick(1, 0, 0)
    assert got.acquire(timeout=10)
    live.close()
    (sample,) = sent
    assert sample["watermark"] == 1_700_000_000_000 and sample["watermark_idle"] is False
    assert sample["watermark_lag_ms"] == sample["timestamp"] - 1_700_000_000_000


def test_no_watermark_or_the_end_of_event_time_is_sent_as_none():
    assert watermark_sample(None, False, 1000) == {}
    assert watermark_sample(MAX_WATERMARK, False, 1000) == {}
    assert watermark_sample(-2001, True, 1000) == {"watermark": -2001, "watermark_lag_ms": 3001, "watermark_idle": True}


def test_without_a_coordinator_to_send_to_the_loop_measures_nothing():
    live = LiveMetrics(None)
    live.tick(1, 1, 1)
    live.close()


def test_the_loop_never_waits_for_a_coordinator_that_hangs_and_only_the_newest_sample_is_sent():
    clock = Clock()
    release = threading.Event()
    sent: list[dict] = []
    first_taken = threading.Event()

    def send(sample, timestamp):
        first_taken.set()
        release.wait(30)  # a coordinator that does not answer
        sent.append(sample)

    live = LiveMetrics(send, interval=1.0, clock=clock)
    clock.t += 1
    live.tick(1, 0, 0)
    assert first_taken.wait(10)
    for records in range(2, 50):  # every tick returns while the sender hangs
        clock.t += 1
        live.tick(records, 0, 0)
    release.set()
    deadline = time.monotonic() + 10
    while len(sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    live.close(timeout=10)
    assert [s["records_in"] for s in sent] == [1, 49]  # the samples in between were replaced, not queued


def test_a_coordinator_that_is_down_costs_nothing_but_the_samples():
    clock = Clock()
    calls = []

    def send(sample, timestamp):
        calls.append(sample)
        raise ConnectionRefusedError("the coordinator is down")

    live = LiveMetrics(send, interval=1.0, clock=clock)
    for records in range(1, 4):
        clock.t += 1
        live.tick(records, 0, 0)
        deadline = time.monotonic() + 10
        while len(calls) < records and time.monotonic() < deadline:
            time.sleep(0.01)
    live.close()
    assert len(calls) == 3 and live._sender.failed == 3


def slow(key, record, state):
    time.sleep(0.0005)
    return [record]


def test_a_backpressured_pipelines_subtasks_report_records_per_second_and_backpressure(coordinator):
    p = Pipeline("live-metrics", parallelism=2)
    p.source(SequenceSource(keys=8), id="src").key_by(lambda r: r[0]).process(slow, id="slow").sink(
        CollectSink(), id="out"
    )
    fake = InMemoryCoordinator()
    with OvertakeClient(coordinator.url) as sdk:
        job = sdk.create_job({"name": "live-metrics", "graph": p.plan().graph().model_dump()})
        attempt = sdk.start_attempt(job.id)
        task = sdk.with_token(attempt.task_token)

        def reporter(spec):
            r = fake.reporter(spec)
            r.report_metrics = lambda metrics, timestamp, spec=spec: task.report_metrics(
                job.id, attempt.attempt, spec.vertex, spec.subtask_index, metrics, timestamp
            )
            return r

        run = ThreadedRun(p, reporter, fake.events, NetworkConfig(buffer_size=512)).start()
        try:
            deadline = time.monotonic() + 60
            while True:
                live = {v.vertex: v for v in sdk.live_metrics(job.id).vertices}
                if live["src"].reporting == 2 and live["slow"].reporting == 2:
                    break
                assert time.monotonic() < deadline, f"no metrics from every subtask: {live}"
                time.sleep(0.2)
        finally:
            for s in run.subtasks:
                s.halted = "test over"
            run.join(60)
            task.close()
    src, slow_vertex = live["src"], live["slow"]
    assert src.records_in_per_second > 0 and slow_vertex.records_in_per_second > 0
    assert src.backpressure_max > 0.2  # the source spends much of its time waiting for the slow stage
    assert slow_vertex.backpressure_max < src.backpressure_max


def idle_partition_events() -> Pipeline:
    """Two source subtasks over four partitions; partition 3 (read by subtask 1) never sends anything."""
    src = EventSequenceSource(count=None, partitions=4, keys=10, interval_ms=10, disorder_ms=20, idle=[3], rate=400)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(20, event_time).with_idleness(300).with_interval(50)
    p = Pipeline("live-watermarks", parallelism=2)
    (
        p.source(src, id="src", watermarks=strategy)
        .key_by(lambda r: r[0])
        .window(TumblingEventTimeWindows.of(500))
        .aggregate(lambda: 0, lambda n, r: n + 1, id="win")
        .sink(DiscardSink(), id="out")
    )
    return p


def event_time(r):
    return r[1]


@pytest.mark.spark
@pytest.mark.slow
def test_an_event_time_pipelines_subtasks_report_watermarks_that_advance_past_an_idle_partition(spark, coordinator):
    seen: list = []  # the live view of the window vertex, each time its low watermark moved
    last_src: list = []  # the sources' live view when the watcher stopped the job
    src_first: dict[int, int] = {}  # each source subtask's first watermark the live view showed

    def sources_advanced(src) -> bool:
        marks = {s.subtask_index: s.metrics.watermark for s in src.subtasks if s.metrics.watermark is not None}
        return (
            len(src_first) == 2 and marks.keys() == src_first.keys()
            and all(marks[i] >= w for i, w in src_first.items()) and any(marks[i] > w for i, w in src_first.items())
        )

    def watch() -> None:
        with OvertakeClient(coordinator.url) as sdk:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                jobs = [j for j in sdk.list_jobs().items if j.name == "live-watermarks"]
                if jobs:
                    live = {v.vertex: v for v in sdk.live_metrics(jobs[0].id).vertices}
                    # the sources report on their own clock: their first watermark may reach the view after the
                    # window vertex's
                    src, win = live.get("src"), live.get("win")
                    for s in src.subtasks if src is not None else ():
                        if s.metrics.watermark is not None:
                            src_first.setdefault(s.subtask_index, s.metrics.watermark)
                    if win is not None and win.low_watermark is not None and (
                        not seen or win.low_watermark > seen[-1].low_watermark
                    ):
                        seen.append(win)
                    if len(seen) >= 3 and src is not None and sources_advanced(src):
                        last_src.append(src)
                        sdk.cancel_job(jobs[0].id)
                        return
                time.sleep(0.3)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    result = idle_partition_events().run(spark, coordinator.url, network=NetworkConfig(buffer_size=2048), time_limit=90)
    watcher.join(10)
    assert result.status == "job cancelled", f"the watermarks did not advance: windows {seen}, sources {src_first}"
    src, win = last_src[-1], seen[-1]
    # partition 3 is idle: source subtask 1 emits the watermark of partition 1 alone, and the windows move on
    assert [s.subtask_index for s in src.subtasks if s.metrics.watermark is not None] == [0, 1]
    assert win.low_watermark == min(s.metrics.watermark for s in win.subtasks if s.metrics.watermark is not None)
    for s in src.subtasks + win.subtasks:
        if s.metrics.watermark is not None:
            assert s.metrics.watermark_lag_ms == s.timestamp - s.metrics.watermark
    # the sources' watermarks advanced too (each subtask's own: the vertex's low watermark can step back when a
    # subtask reports its first watermark after the others)
    assert sources_advanced(src), (src_first, src)
