"""The subtask loop over real sockets, all subtasks as threads of this process, with an in-memory coordinator.

A slow keyed stage backpressures the source; each test checks what the checkpoints persisted, decoding the
blobs: a checkpoint is a consistent cut (state + persisted in-flight records = exactly what the sources
emitted), unaligned ones persist in-flight buffers, aligned ones persist none.
"""

from __future__ import annotations

import time

import pytest

from spark_plugin import Pipeline
from spark_plugin.connectors import CollectSink, SequenceSource
from spark_plugin.network.config import NetworkConfig
from spark_plugin.task.life import SubtaskLife
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.consistency import assert_consistent_cut, cut_of_checkpoint
from tests.spark_plugin.fakes import InMemoryCoordinator

SMALL = NetworkConfig(buffer_size=512)


def slow_count(key, record, state):
    time.sleep(0.0003)
    state.update((state.value() or 0) + 1)
    return [record]


def backpressured(count: int, source_parallelism: int = 2, sink: CollectSink | None = None) -> Pipeline:
    p = Pipeline("threads", parallelism=source_parallelism)
    (
        p.source(SequenceSource(count=count, keys=16), id="src")
        .map(lambda r: r, id="parse")
        .key_by(lambda r: r[0])
        .process(slow_count, id="slow", parallelism=2)
        .sink(sink or CollectSink(), id="out")
    )
    return p


def wait_for(cond, what: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def run_with_triggers(p: Pipeline, triggers: list[tuple], network=SMALL):
    coord = InMemoryCoordinator()
    run = ThreadedRun(p, coord.reporter, coord.events, network).start()
    slow = run.subtask("slow", 0)
    for i, (cid, policy, timeout) in enumerate(triggers):
        wait_for(lambda i=i: slow.records_in > 300 * (i + 1), "records to flow")
        coord.trigger(cid, policy, timeout)
        wait_for(lambda cid=cid: len(coord.acks.get(cid, {})) == 4 or any(d[0] == cid for d in coord.declines),
                 f"checkpoint {cid}")
    results = run.join(120)
    return coord, results


def cut(coord: InMemoryCoordinator, cid: int) -> dict:
    return cut_of_checkpoint(coord.acks[cid], coord.blobs.__getitem__, "out", "src")


def all_output(results) -> list:
    return sorted(r[1] for res in results for out in res.outputs.values() if "records" in out for r in out["records"])


def test_unaligned_checkpoints_under_backpressure_persist_in_flight_buffers_forming_a_consistent_cut():
    coord, results = run_with_triggers(backpressured(6000), [(1, "unaligned", None), (2, "unaligned", None)])
    assert all_output(results) == list(range(6000))
    for cid in (1, 2):
        c = cut(coord, cid)
        assert_consistent_cut(c, 2)
        assert c["input"] or c["output"], f"checkpoint {cid} persisted no in-flight data"
        assert all(a["metrics"]["unaligned"] for a in coord.acks[cid].values())


def test_aligned_checkpoints_persist_no_channel_state_and_form_a_consistent_cut():
    coord, results = run_with_triggers(backpressured(4000), [(1, "aligned", None)])
    assert all_output(results) == list(range(4000))
    c = cut(coord, 1)
    assert c["input"] == [] and c["output"] == []
    assert_consistent_cut(c, 2)
    assert not any(a["metrics"]["unaligned"] for a in coord.acks[1].values())


def test_aligned_then_unaligned_stays_aligned_when_alignment_ends_before_the_timeout():
    coord, _ = run_with_triggers(backpressured(4000), [(1, "aligned_then_unaligned", 600_000)])
    c = cut(coord, 1)
    assert c["input"] == [] and c["output"] == []
    assert_consistent_cut(c, 2)


def test_aligned_then_unaligned_switches_once_the_timeout_passed():
    # a 1 ms timeout passes while the barrier waits behind the queued buffers of the backpressured channels
    coord, _ = run_with_triggers(backpressured(6000), [(1, "aligned_then_unaligned", 1)])
    c = cut(coord, 1)
    assert_consistent_cut(c, 2)
    assert c["input"] or c["output"]
    assert any(a["metrics"]["unaligned"] for a in coord.acks[1].values())


@pytest.mark.parametrize("policy", ["aligned", "unaligned"])
def test_a_newer_checkpoint_supersedes_an_unfinished_one(policy):
    coord = InMemoryCoordinator()
    run = ThreadedRun(backpressured(6000), coord.reporter, coord.events, SMALL).start()
    wait_for(lambda: run.subtask("slow", 0).records_in > 300, "records to flow")
    coord.trigger(1, policy)
    coord.trigger(2, policy)  # the sources emit barrier 2 right behind barrier 1
    wait_for(lambda: len(coord.acks.get(2, {})) == 4, "checkpoint 2")
    run.join(120)
    assert_consistent_cut(cut(coord, 2), 2)
    # checkpoint 1 either completed everywhere or was declined by the subtasks that saw barrier 2 first
    assert len(coord.acks.get(1, {})) == 4 or any(d[0] == 1 for d in coord.declines)


class FailingSink(CollectSink):
    def write(self, record):
        raise RuntimeError(f"sink cannot write {record!r}")


class SinkFailingItsSnapshot(CollectSink):
    """Fails in its first subtask only: every other subtask fails because a channel broke."""

    def snapshot(self, checkpoint_id):
        if self.subtask_index == 0:
            raise RuntimeError(f"sink cannot snapshot checkpoint {checkpoint_id}")
        return super().snapshot(checkpoint_id)


class FailingSource(SequenceSource):
    def poll(self, max_records):
        raise RuntimeError("source cannot read")


def test_a_sink_that_raises_fails_its_upstream_subtasks_instead_of_leaving_them_waiting_for_credit():
    p = Pipeline("failing-sink", parallelism=2)
    p.source(SequenceSource(count=20_000, keys=4), id="src").rebalance().map(lambda r: r, id="m").sink(
        FailingSink(), id="out"
    )
    coord = InMemoryCoordinator()
    run = ThreadedRun(p, coord.reporter, coord.events, SMALL).start()
    with pytest.raises(RuntimeError, match="sink cannot write"):
        run.join(20)
    upstream = [e for i, e in run.errors.items() if run.lives[i].subtask.spec.vertex == "src"]
    assert len(upstream) == 2 and all("broke" in str(e) for e in upstream)


def test_a_source_that_raises_fails_its_downstream_subtasks_instead_of_leaving_them_waiting_for_input():
    p = Pipeline("failing-source", parallelism=2)
    p.source(FailingSource(count=10, keys=2), id="src").rebalance().map(lambda r: r, id="m").sink(
        CollectSink(), id="out"
    )
    coord = InMemoryCoordinator()
    run = ThreadedRun(p, coord.reporter, coord.events, SMALL).start()
    with pytest.raises(RuntimeError, match="source cannot read"):
        run.join(20)
    downstream = [e for i, e in run.errors.items() if run.lives[i].subtask.spec.vertex == "m"]
    assert len(downstream) == 2 and all("broke" in str(e) for e in downstream)


def test_a_failed_subtask_raises_its_own_error_before_it_closes_its_channels(monkeypatch):
    # in Spark the first task error to arrive is the stage's failure reason: the peers' broken channels must not
    # overtake the error that caused them
    gate_closed_when_raised: dict[str, bool] = {}
    loop = SubtaskLife.run

    def run(self):
        try:
            return loop(self)
        except BaseException:
            gate_closed_when_raised[self.subtask.spec.name] = self.subtask.gate.closed
            raise

    monkeypatch.setattr(SubtaskLife, "run", run)
    coord = InMemoryCoordinator()
    run_ = ThreadedRun(backpressured(20_000, sink=SinkFailingItsSnapshot()), coord.reporter, coord.events, SMALL)
    run_.start()
    wait_for(lambda: run_.subtask("slow", 0).records_in > 100, "records to flow")
    coord.trigger(1, "aligned")
    with pytest.raises(RuntimeError, match="sink cannot snapshot checkpoint 1"):
        run_.join(20)
    assert gate_closed_when_raised["slow[0]"] is False
    assert sum("broke" in str(e) for e in run_.errors.values()) == 3  # then the others failed: it closed them
