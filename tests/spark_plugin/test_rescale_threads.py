"""Restoring an unaligned checkpoint with a different parallelism of the keyed stage (rescaling).

Keyed state is split by key-group range; in-flight records of hash edges go to the new owner of their key
group (output buffers are partitioned again, input buffers filtered by key group); the sink's non-keyed state
goes to one new subtask each. Every record must arrive exactly once.
"""

from __future__ import annotations

import pytest

from contract.events import JobStatusChanged
from contract.keygroups import key_group_range
from spark_plugin.network.config import NetworkConfig
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.fakes import InMemoryCoordinator
from tests.spark_plugin.test_restore_threads import plan_from_acks
from tests.spark_plugin.test_subtask_threads import backpressured, wait_for

SMALL = NetworkConfig(buffer_size=512)


def rescale_plan(acks: dict, vertex: str, new_parallelism: int, max_parallelism: int = 128) -> dict:
    """A restore plan for ``vertex`` at ``new_parallelism``: every new subtask gets every old slice of keyed
    state and every old input segment of its hash edge; the other vertices keep their own parts."""
    old = plan_from_acks(acks)
    plan = {k: v for k, v in old.items() if k[0] != vertex}
    slices = [v for k, v in sorted(old.items()) if k[0] == vertex]
    for i in range(new_parallelism):
        start, end = key_group_range(i, max_parallelism, new_parallelism)
        plan[(vertex, i)] = {
            "key_group_start": start,
            "key_group_end": end,
            "operator_state": [ref for s in slices for ref in s["operator_state"]],
            "source_offsets": None,
            "output_channel_state": [],
            "input_channel_state": [seg for s in slices for seg in s["input_channel_state"]],
        }
    return plan


@pytest.mark.parametrize("new_parallelism", [3, 1])
def test_rescaled_restore_of_an_unaligned_checkpoint_delivers_every_record_exactly_once(new_parallelism):
    count = 6000
    coord = InMemoryCoordinator()
    first = ThreadedRun(backpressured(count), coord.reporter, coord.events, SMALL).start()
    wait_for(lambda: first.subtask("slow", 0).records_in > 600, "records to flow")
    coord.trigger(1, "unaligned")
    wait_for(lambda: len(coord.acks.get(1, {})) == 4, "checkpoint 1")
    coord.publish(JobStatusChanged(status="CANCELLED"))
    first.join(60)
    old = plan_from_acks(coord.acks[1])
    assert any(p["input_channel_state"] for k, p in old.items() if k[0] == "slow")
    assert any(p["output_channel_state"] for k, p in old.items() if k[0] == "src")

    def fetch(blob_id, start, end):
        data = coord.blobs[blob_id]
        return data if start is None else data[start : end + 1]

    pipeline = backpressured(count)
    for node in pipeline.nodes:
        if node.op.id == "slow":
            node.op.parallelism = new_parallelism
        if node.op.id == "out":
            node.op.parallelism = new_parallelism
    second = ThreadedRun(
        pipeline, InMemoryCoordinator().reporter, InMemoryCoordinator().events, SMALL,
        restore=rescale_plan(coord.acks[1], "slow", new_parallelism), fetch=fetch, restore_checkpoint=1,
    )
    assert [v.parallelism for v in second.plan.vertices] == [2, new_parallelism]
    results = second.start().join(120)
    slow = [st for st in second.subtasks if st.spec.vertex == "slow"]
    if new_parallelism > 2:
        rerouted = sum(st.restore_stats.rerouted_records for st in second.subtasks if st.restore_stats)
        assert rerouted > 0, "no in-flight record had to change its subtask: the test did not rescale anything"
    else:
        assert slow[0].restore_stats.operator_blobs == 2  # both old subtasks' state merged into one
    seqs = sorted(r[1] for res in results for o in res.outputs.values() if "records" in o for r in o["records"])
    assert seqs == list(range(count)), f"{len(seqs) - len(set(seqs))} duplicates, {count - len(set(seqs))} missing"
