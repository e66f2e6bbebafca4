"""Concurrent unaligned checkpoints in a threaded run under backpressure: two in flight at once both complete, each
is a consistent cut, and a restore from the newer one delivers every record exactly once, in per-key order."""

from __future__ import annotations

from contract.events import JobStatusChanged
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.consistency import assert_consistent_cut
from tests.spark_plugin.fakes import InMemoryCoordinator
from tests.spark_plugin.test_restore_threads import plan_from_acks
from tests.spark_plugin.test_subtask_threads import SMALL, all_output, backpressured, cut, wait_for


def both_checkpoints_in_flight(count: int) -> tuple[InMemoryCoordinator, ThreadedRun]:
    """Checkpoints 1 and 2 triggered back to back with max_concurrent=2: barrier 2 follows barrier 1 closely
    through the backpressured channels."""
    coord = InMemoryCoordinator()
    run = ThreadedRun(backpressured(count), coord.reporter, coord.events, SMALL).start()
    wait_for(lambda: run.subtask("slow", 0).records_in > 300, "records to flow")
    coord.trigger(1, "unaligned", max_concurrent=2)
    coord.trigger(2, "unaligned", max_concurrent=2)
    wait_for(lambda: len(coord.acks.get(1, {})) == 4 and len(coord.acks.get(2, {})) == 4, "checkpoints 1 and 2")
    return coord, run


def test_two_unaligned_checkpoints_in_flight_both_complete_as_consistent_cuts():
    coord, run = both_checkpoints_in_flight(6000)
    results = run.join(120)
    assert coord.declines == []
    assert all_output(results) == list(range(6000))
    for cid in (1, 2):
        c = cut(coord, cid)
        assert_consistent_cut(c, 2)
        assert all(a["metrics"]["unaligned"] for a in coord.acks[cid].values())
    assert cut(coord, 1)["input"] or cut(coord, 1)["output"], "checkpoint 1 persisted no in-flight data"


def test_a_restore_from_the_newer_of_two_concurrent_checkpoints_is_exactly_once_in_order():
    count = 6000
    coord, first = both_checkpoints_in_flight(count)
    coord.publish(JobStatusChanged(status="CANCELLED"))  # stop mid-stream, as a failure would
    first.join(60)

    def fetch(blob_id, start, end):
        data = coord.blobs[blob_id]
        return data if start is None else data[start : end + 1]

    second_coord = InMemoryCoordinator()
    second = ThreadedRun(
        backpressured(count), second_coord.reporter, second_coord.events, SMALL,
        restore=plan_from_acks(coord.acks[2]), fetch=fetch, restore_checkpoint=2,
    ).start()
    results = second.join(120)
    records = [r for res in results for out in res.outputs.values() if "records" in out for r in out["records"]]
    seqs = sorted(r[1] for r in records)
    assert seqs == list(range(count)), f"{len(seqs) - len(set(seqs))} duplicates, {len(set(range(count)) - set(seqs))} missing"
    for res in results:
        if res.vertex != "slow":
            continue
        by_stream: dict[tuple, list[int]] = {}
        for key, seq in res.outputs["out"]["records"]:
            by_stream.setdefault((key, seq % 2), []).append(seq)  # seq % 2 is the source subtask
        assert all(v == sorted(v) for v in by_stream.values()), "records of a key were reordered"
