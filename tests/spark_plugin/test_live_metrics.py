"""A subtask's live metrics: rates and backpressure once a second, sent off the loop, never waiting for the
coordinator; and, end to end, what the coordinator shows of a backpressured pipeline's subtasks."""

from __future__ import annotations

import threading
import time

from client.sync import OvertakeClient
from spark_plugin import Pipeline
from spark_plugin.connectors import CollectSink, SequenceSource
from spark_plugin.network.config import NetworkConfig
from spark_plugin.task.metrics import LiveMetrics
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
