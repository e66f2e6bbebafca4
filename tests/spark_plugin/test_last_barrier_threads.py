"""unaligned_last_barrier over real sockets, all subtasks as threads: a flat_map that emits 100 records per input,
backpressured by a slow keyed stage. Each checkpoint is a consistent cut, and what it persisted is the flat_map's
inputs (source records), never one of its outputs."""

from __future__ import annotations

import time

import pytest

from spark_plugin import Pipeline
from spark_plugin.connectors import CollectSink, SequenceSource
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.consistency import assert_consistent_flat_cut, flat_cut_of_checkpoint
from tests.spark_plugin.fakes import InMemoryCoordinator
from tests.spark_plugin.test_subtask_threads import SMALL, wait_for

FANOUT = 100
SOURCE_RECORDS = 1200
SUBTASKS = 6  # src, flat and slow (with its sink chained), two of each


def fan_out(record):
    key, seq, _payload = record
    return [(key, seq, j) for j in range(FANOUT)]


def slow_per_input(key, record, state):
    if record[2] == 0:
        time.sleep(0.002)  # 2 ms for the outputs of one source record
    state.update((state.value() or 0) + 1)
    return [record]


def flat_map_pipeline(count: int = SOURCE_RECORDS) -> Pipeline:
    p = Pipeline("flat", parallelism=2)
    (
        p.source(SequenceSource(count=count, keys=16, payload=100), id="src")
        .rebalance()
        .flat_map(fan_out, id="flat")
        .key_by(lambda r: r[0])
        .process(slow_per_input, id="slow")
        .sink(CollectSink(), id="out")
    )
    return p


def run_checkpoints(policy: str, ids: tuple[int, ...]) -> tuple[InMemoryCoordinator, list]:
    coord = InMemoryCoordinator()
    run = ThreadedRun(flat_map_pipeline(), coord.reporter, coord.events, SMALL).start()
    slow = run.subtask("slow", 0)
    for i, cid in enumerate(ids):
        wait_for(lambda i=i: slow.records_in > 2_000 * (i + 1), "records to flow")
        coord.trigger(cid, policy)
        wait_for(lambda cid=cid: len(coord.acks.get(cid, {})) == SUBTASKS or any(d[0] == cid for d in coord.declines),
                 f"checkpoint {cid}")
    return coord, run.join(180)


def flat_cut(coord: InMemoryCoordinator, cid: int) -> dict:
    return flat_cut_of_checkpoint(coord.acks[cid], coord.blobs.__getitem__, "out", "src")


def all_outputs(results) -> list:
    return sorted((r[1], r[2]) for res in results for out in res.outputs.values() if "records" in out
                  for r in out["records"])


@pytest.fixture(scope="module")
def last_barrier_run():
    return run_checkpoints("unaligned_last_barrier", (1, 2))


def test_last_barrier_checkpoints_of_a_backpressured_flat_map_complete_everywhere(last_barrier_run):
    coord, results = last_barrier_run
    assert not coord.declines
    assert all(len(coord.acks[cid]) == SUBTASKS for cid in (1, 2))
    assert all_outputs(results) == [(seq, j) for seq in range(SOURCE_RECORDS) for j in range(FANOUT)]


def test_each_last_barrier_checkpoint_is_a_consistent_cut(last_barrier_run):
    coord, _ = last_barrier_run
    for cid in (1, 2):
        assert_consistent_flat_cut(flat_cut(coord, cid), FANOUT)


def test_last_barrier_persists_the_flat_maps_inputs_and_none_of_its_outputs(last_barrier_run):
    coord, _ = last_barrier_run
    for cid in (1, 2):
        c = flat_cut(coord, cid)
        assert c["outputs"] == [], f"checkpoint {cid} persisted flat_map outputs at {c['where']['flat_map outputs']}"
        assert c["sources"], f"checkpoint {cid} persisted nothing in flight under backpressure"
        # the sources' output queues (their barrier overtakes them) and the flat_map's input queues
        assert c["where"]["source records"] <= {("src", "output"), ("flat", "input")}
        assert not c["bytes"][("flat", "output")] and not c["bytes"][("slow", "input")]


def test_first_barrier_unaligned_persists_flat_map_outputs_under_the_same_load():
    coord, _ = run_checkpoints("unaligned", (1,))
    c = flat_cut(coord, 1)
    assert_consistent_flat_cut(c, FANOUT)
    assert c["outputs"], "the flat_map's output queue and its consumers' input queues hold its outputs"
