"""A subtask's live metrics: rates, backpressure and the watermark once a second, sent off the loop, never waiting
for the coordinator; and, end to end, what the coordinator shows of a backpressured pipeline's subtasks and of an
event-time pipeline's watermarks."""

from __future__ import annotations

import threading
import time

import pytest

from client.sync import OvertakeClient
from contract.models import SubtaskMetrics
from spark_plugin import Pipeline
from spark_plugin.api.watermarks import MAX_WATERMARK, WatermarkStrategy
from spark_plugin.api.windows import TumblingEventTimeWindows
from spark_plugin.connectors import CollectSink, DiscardSink, SequenceSource
from spark_plugin.connectors.base import PartitionedSource, Source, SplitReader
from spark_plugin.connectors.event_sequence import EventSequenceSource
from spark_plugin.connectors.split_reading import POSITION_CHARS, short_position
from spark_plugin.network.config import NetworkConfig
from spark_plugin.task.metrics import MAX_SPLITS, LiveMetrics, watermark_sample
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.fakes import InMemoryCoordinator
from tests.spark_plugin.test_partitioned_source import Orders


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


def test_a_forced_sample_goes_out_before_the_interval_with_the_recovery_as_it_is_then():
    clock = Clock()
    sent, got, send = collecting()
    live = LiveMetrics(send, interval=1.0, clock=clock)
    recovery = {"replayed_bytes": 0, "replay_finished_at": None}
    live.recovery = lambda: dict(recovery)
    clock.t += 0.1
    live.tick(1, 0, 0)  # within the interval: nothing
    recovery.update(replayed_bytes=300, replay_finished_at=1234)
    live.tick(2, 0, 0, force=True)
    assert got.acquire(timeout=10)
    live.close()
    (sample,) = sent
    assert sample["recovery"] == {"replayed_bytes": 300, "replay_finished_at": 1234}
    assert sample["records_in"] == 2


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
    # the source subtasks report the splits they read, each with its position; the keyed stage has no splits
    for s in src.subtasks:
        assert s.metrics.splits and all(split.position is not None for split in s.metrics.splits), s.metrics
    assert all(s.metrics.splits is None for s in slow_vertex.subtasks)


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


def test_rates_under_bursts_are_averaged_over_the_smoothing_window_which_the_sample_names():
    """Under backpressure records move in bursts as credit arrives: one second's count swings between nothing and
    a burst. A sample covers the last `smoothing` seconds, and its window_ms says so."""
    clock = Clock()
    sent, got, send = collecting()
    live = LiveMetrics(send, interval=1.0, clock=clock, smoothing=5.0)
    for records in (0, 1000, 1000, 2000, 2000, 3000):  # a burst every other second
        clock.t += 1.0
        live.tick(records_in=records, bytes_in=0, bytes_out=0)
        assert got.acquire(timeout=10)
    live.close()
    last = sent[-1]
    assert last["window_ms"] == 5000
    assert last["records_in_per_second"] == 600.0  # 3000 records over the last 5 s, not the last second's 1000


# --------------------------------------------------------------------------- a source's splits


class Backlog(PartitionedSource):
    """Splits ``log-0`` ... of ``per_split`` records; each reader knows its end, so its lag."""

    def __init__(self, splits: int, per_split: int = 10) -> None:
        self.splits, self.per_split = splits, per_split

    def list_splits(self) -> list[str]:
        return [f"log-{i}" for i in range(self.splits)]

    def build_split_reader(self, split: str, position):
        return BacklogReader(position or 0, self.per_split)


class BacklogReader(SplitReader):
    def __init__(self, n: int, end: int) -> None:
        self.n, self.end = n, end

    def poll(self, max_records):
        if self.n >= self.end:
            return None
        m = min(max_records, self.end - self.n)
        self.n += m
        return list(range(m))

    def position(self):
        return self.n

    def lag(self):
        return self.end - self.n


def test_a_source_subtasks_sample_carries_its_splits_positions_and_lag():
    src = Backlog(splits=3)
    src.open(0, 1)
    src.poll(4)  # log-0 at 4 of 10
    clock = Clock()
    sent, got, send = collecting()
    live = LiveMetrics(send, interval=1.0, clock=clock, splits=src.split_metrics)
    clock.t += 1
    live.tick(4, 0, 0)
    assert got.acquire(timeout=10)
    live.close()
    (sample,) = sent
    assert sample["splits"] == [
        {"split": "log-0", "position": "4", "lag": 6},
        {"split": "log-1", "position": None, "lag": None},  # not read yet: neither is known
        {"split": "log-2", "position": None, "lag": None},
    ]
    assert sample["splits_more"] == 0


def test_an_ended_split_has_no_lag_left_and_a_reader_that_does_not_know_says_none():
    src = Backlog(splits=1, per_split=3)
    src.open(0, 1)
    src.poll(3)
    assert src.poll(3) is None
    assert src.split_metrics(100)["splits"] == [{"split": "log-0", "position": "3", "lag": 0}]

    orders = Orders(splits=1)
    orders.open(0, 1)
    orders.poll(5)
    assert orders.split_metrics(100)["splits"] == [{"split": "orders-0", "position": "5", "lag": None}]


def test_a_sample_lists_at_most_max_splits_and_counts_the_rest():
    src = Backlog(splits=MAX_SPLITS + 30)
    src.open(0, 1)
    metrics = src.split_metrics(MAX_SPLITS)
    assert len(metrics["splits"]) == MAX_SPLITS and metrics["splits_more"] == 30
    assert SubtaskMetrics.model_validate(metrics).splits_more == 30  # what the coordinator takes


def test_a_long_position_is_cut_short_for_the_live_view():
    assert short_position({"offset": 7, "skip_before": 1_700_000_000_000}) == "{'offset': 7, 'skip_before': 1700000000000}"
    assert len(short_position("x" * 500)) == POSITION_CHARS and short_position(None) is None


def test_only_a_partitioned_source_reports_splits():
    seq = SequenceSource(keys=1)
    seq.open(0, 1)
    assert seq.split_metrics(MAX_SPLITS)["splits"]
    assert Source().split_metrics(MAX_SPLITS) == {}


def test_a_reader_whose_lag_fails_costs_the_sample_its_splits_not_the_subtask():
    class Broken(BacklogReader):
        def lag(self):
            raise RuntimeError("no figure")

    src = Backlog(splits=1)
    src.build_split_reader = lambda split, position: Broken(position or 0, 10)
    src.open(0, 1)
    src.poll(4)
    clock = Clock()
    sent, got, send = collecting()
    live = LiveMetrics(send, interval=1.0, clock=clock, splits=src.split_metrics)
    clock.t += 1
    live.tick(4, 0, 0)
    assert got.acquire(timeout=10)
    live.close()
    (sample,) = sent
    assert sample["records_in"] == 4 and "splits" not in sample
