"""Restore from an unaligned checkpoint: operator state, source offsets, output then input channel state.

A backpressured run takes an unaligned checkpoint and is then stopped (as a failure would); a second run
restored from that checkpoint must deliver every record exactly once, in per-key order.
"""

from __future__ import annotations

import dataclasses

import pytest

from contract.events import JobStatusChanged
from spark_plugin.network.config import NetworkConfig
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.fakes import InMemoryCoordinator
from tests.spark_plugin.test_subtask_threads import backpressured, wait_for

SMALL = NetworkConfig(buffer_size=512)


def plan_from_acks(acks: dict) -> dict:
    """What the coordinator's restore plan holds per subtask, built from the fake's acks (no rescaling)."""
    plan = {}
    for (vertex, index), ack in acks.items():
        blob = (ack.get("channel_state") or {}).get("blob_id")
        segs = [{**s, "blob_id": blob, "from_subtask": index} for s in ack["channel_segments"]]
        plan[(vertex, index)] = {
            "operator_state": [{**ack["operator_state"], "from_subtask": index}]
            if ack.get("operator_state")
            else [],
            "source_offsets": ack.get("source_offsets"),
            "output_channel_state": [s for s in segs if s["direction"] == "output"],
            "input_channel_state": [s for s in segs if s["direction"] == "input"],
        }
    return plan


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_restore_from_an_unaligned_checkpoint_delivers_every_record_exactly_once_in_order(compression):
    """Also with the channel state compressed: the restore inflates each segment by the codec it names."""
    count = 6000
    network = dataclasses.replace(SMALL, channel_state_compression=compression)
    coord = InMemoryCoordinator()
    first = ThreadedRun(backpressured(count), coord.reporter, coord.events, network).start()
    wait_for(lambda: first.subtask("slow", 0).records_in > 600, "records to flow")
    coord.trigger(1, "unaligned")
    wait_for(lambda: len(coord.acks.get(1, {})) == 4, "checkpoint 1")
    coord.publish(JobStatusChanged(status="CANCELLED"))  # stop mid-stream, as a failure would
    first.join(60)

    plan = plan_from_acks(coord.acks[1])
    assert any(p["input_channel_state"] or p["output_channel_state"] for p in plan.values())
    segments = [s for ack in coord.acks[1].values() for s in ack["channel_segments"]]
    assert {s.get("codec") for s in segments} == {compression}

    def fetch(blob_id, start, end):
        data = coord.blobs[blob_id]
        return data if start is None else data[start : end + 1]

    second_coord = InMemoryCoordinator()
    second = ThreadedRun(
        backpressured(count), second_coord.reporter, second_coord.events, network,
        restore=plan, fetch=fetch, restore_checkpoint=1,
    ).start()
    results = second.join(120)
    records = [r for res in results for out in res.outputs.values() if "records" in out for r in out["records"]]
    seqs = sorted(r[1] for r in records)
    assert seqs == list(range(count)), (
        f"{len(seqs) - len(set(seqs))} duplicates, {len(set(range(count)) - set(seqs))} missing"
    )
    for res in results:
        if res.vertex != "slow":
            continue
        by_stream: dict[tuple, list[int]] = {}
        for key, seq in res.outputs["out"]["records"]:
            by_stream.setdefault((key, seq % 2), []).append(seq)  # seq % 2 is the source subtask
        assert all(v == sorted(v) for v in by_stream.values()), "records of a key were reordered"
