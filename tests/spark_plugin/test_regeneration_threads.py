"""Regenerated outputs over real sockets, every subtask a thread: a deterministic flat_map with 100 outputs per input,
backpressured by a slow keyed stage. A last-barrier checkpoint persists none of its outputs (neither its output queue
nor its consumers' input queues) and logs the inputs whose outputs are in flight; a restore, also with both stages
rescaled, regenerates them and delivers every output exactly once, in order per key."""

from __future__ import annotations

import pickle

import pytest

from contract.events import JobStatusChanged
from spark_plugin import Pipeline
from spark_plugin.connectors import CollectSink, SequenceSource
from spark_plugin.network.recovered import RestoreMismatch
from spark_plugin.task.regeneration import COUNTS, LOG, logged_inputs
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.consistency import flat_cut_of_checkpoint
from tests.spark_plugin.fakes import InMemoryCoordinator
from tests.spark_plugin.test_last_barrier_threads import FANOUT, SUBTASKS, fan_out, slow_per_input
from tests.spark_plugin.test_rescale_threads import rescale_plan
from tests.spark_plugin.test_restore_threads import plan_from_acks
from tests.spark_plugin.test_subtask_threads import SMALL, wait_for

SOURCE_RECORDS = 1500


def pipeline(deterministic: bool = True, flat: int = 2, slow: int = 2) -> Pipeline:
    p = Pipeline("regen", parallelism=2)
    (
        p.source(SequenceSource(count=SOURCE_RECORDS, keys=16, payload=100), id="src")
        .rebalance()
        .flat_map(fan_out, id="flat", deterministic=deterministic, parallelism=flat)
        .key_by(lambda r: r[0])
        .process(slow_per_input, id="slow", parallelism=slow)
        .sink(CollectSink(), id="out", parallelism=slow)
    )
    return p


def fetch_of(coord: InMemoryCoordinator):
    def fetch(blob_id, start, end):
        data = coord.blobs[blob_id]
        return data if start is None else data[start : end + 1]

    return fetch


@pytest.fixture(scope="module")
def checkpointed():
    """A run that took last-barrier checkpoint 1 under backpressure and was then cancelled mid-stream."""
    coord = InMemoryCoordinator()
    run = ThreadedRun(pipeline(), coord.reporter, coord.events, SMALL).start()
    wait_for(lambda: run.subtask("slow", 0).records_in > 3_000, "records to flow")
    coord.trigger(1, "unaligned_last_barrier")
    wait_for(lambda: len(coord.acks.get(1, {})) == SUBTASKS or coord.declines, "checkpoint 1")
    coord.publish(JobStatusChanged(status="CANCELLED"))
    run.join(120)
    assert not coord.declines
    return coord


def _state(coord: InMemoryCoordinator, vertex: str, index: int) -> dict:
    return pickle.loads(coord.blobs[coord.acks[1][(vertex, index)]["operator_state"]["blob_id"]])


def _outputs(results) -> list[tuple]:
    return [r for res in results for out in res.outputs.values() if "records" in out for r in out["records"]]


def _assert_exactly_once_in_order(results) -> None:
    records = _outputs(results)
    got = sorted((r[1], r[2]) for r in records)
    want = [(seq, j) for seq in range(SOURCE_RECORDS) for j in range(FANOUT)]
    assert got == want, f"{len(got) - len(set(got))} duplicates, {len(set(want) - set(got))} missing"
    for res in results:
        if res.vertex != "slow":
            continue
        # the outputs of one input travel one channel (a rebalance edge spreads the inputs of a key over both
        # flat_map subtasks, so only they keep an order): they reach the keyed stage in the order they were made
        of_input: dict = {}
        for _key, seq, j in res.outputs["out"]["records"]:
            of_input.setdefault(seq, []).append(j)
        assert all(v == sorted(v) for v in of_input.values()), "the outputs of an input were reordered"


def test_a_last_barrier_checkpoint_of_a_deterministic_flat_map_persists_none_of_its_outputs(checkpointed):
    coord = checkpointed
    cut = flat_cut_of_checkpoint(coord.acks[1], coord.blobs.__getitem__, "out", "src")
    assert cut["outputs"] == [], f"flat_map outputs persisted at {cut['where']['flat_map outputs']}"
    assert not cut["bytes"][("flat", "output")] and not cut["bytes"][("slow", "input")]
    logs = [_state(coord, "flat", i)[LOG] for i in range(2)]
    assert [log["producer"] for log in logs] == [0, 1]
    logged = [r for log in logs for r in logged_inputs(log)]
    assert logged, "under backpressure the flat_map's outputs are in flight"
    assert all(len(r) == 3 and isinstance(r[2], str) for r in logged), "the log holds the flat_map's inputs"
    # each log holds only inputs whose outputs may still be in flight: a few buffers' worth per channel, not its
    # whole history
    assert len(logged) < SOURCE_RECORDS // 4
    for i, log in enumerate(logs):  # what the flat_map reports as persisted in flight: its logged inputs
        metrics = coord.acks[1][("flat", i)]["metrics"]
        assert metrics["persisted_data"] >= len(log["inputs"]) * bool(logged_inputs(log))
    # the keyed stage's counts are what it processed before its snapshot: every record its chained sink holds
    counts = [_state(coord, "slow", i)[COUNTS]["flat"] for i in range(2)]
    processed = sum(n for c in counts for by_producer in c.values() for n in by_producer.values())
    assert processed == sum(len(_state(coord, "slow", i)["operators"]["out"]["records"]) for i in range(2))


def test_a_restore_regenerates_the_logged_inputs_outputs_exactly_once_in_order(checkpointed):
    coord = checkpointed
    second = InMemoryCoordinator()
    run = ThreadedRun(pipeline(), second.reporter, second.events, SMALL, restore=plan_from_acks(coord.acks[1]),
                      fetch=fetch_of(coord), restore_checkpoint=1).start()
    results = run.join(180)
    _assert_exactly_once_in_order(results)
    flat_stats = [run.subtask("flat", i).restore_stats for i in range(2)]
    assert sum(s.regenerated_inputs for s in flat_stats) == sum(
        len(logged_inputs(_state(coord, "flat", i)[LOG])) for i in range(2)
    )


@pytest.mark.parametrize(("flat", "slow"), [(1, 3), (3, 1)])
def test_a_rescaled_restore_regenerates_exactly_once(checkpointed, flat, slow):
    """Both stages change parallelism: each old flat_map subtask's log goes whole to one new subtask, and each new
    keyed subtask restores the counts of the key groups it owns."""
    coord = checkpointed
    plan = rescale_plan(coord.acks[1], "slow", slow)
    old_flat = {k: v for k, v in plan_from_acks(coord.acks[1]).items() if k[0] == "flat"}
    for key in list(plan):
        if key[0] == "flat":
            del plan[key]
    for i in range(flat):  # the old subtasks that map to i (from_subtask % parallelism == i) give it their state
        mine = [p for (_, j), p in sorted(old_flat.items())]
        plan[("flat", i)] = {
            "operator_state": [ref for p in mine for ref in p["operator_state"]],
            "source_offsets": None,
            "output_channel_state": [],
            "input_channel_state": [seg for (_, j), p in sorted(old_flat.items()) if j % flat == i
                                    for seg in p["input_channel_state"]],
        }
    second = InMemoryCoordinator()
    run = ThreadedRun(pipeline(flat=flat, slow=slow), second.reporter, second.events, SMALL, restore=plan,
                      fetch=fetch_of(coord), restore_checkpoint=1).start()
    _assert_exactly_once_in_order(run.join(180))


def test_a_checkpoint_with_a_log_is_not_restored_into_a_flat_map_that_no_longer_regenerates(checkpointed):
    coord = checkpointed
    second = InMemoryCoordinator()
    with pytest.raises(Exception) as failed:
        run = ThreadedRun(pipeline(deterministic=False), second.reporter, second.events, SMALL,
                          restore=plan_from_acks(coord.acks[1]), fetch=fetch_of(coord), restore_checkpoint=1)
        run.start().join(60)
    assert isinstance(failed.value, RestoreMismatch) or "deterministic=True" in str(failed.value)
