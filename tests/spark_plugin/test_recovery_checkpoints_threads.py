"""Checkpoints during recovery: a restored subtask that still replays its restored in-flight data takes a checkpoint,
whose channel state holds what it had not replayed yet; a restore from that checkpoint is exactly once, in order.

The keyed stage holds its first restored record until the checkpoint's barrier is announced on its gate (or acted
on, when it came before that record), so the checkpoint starts during the replay on every machine, however loaded.
"""

from __future__ import annotations

import threading
import time

from contract.events import JobStatusChanged
from spark_plugin import Pipeline
from spark_plugin.connectors import CollectSink, SequenceSource
from spark_plugin.network.config import NetworkConfig
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.fakes import InMemoryCoordinator
from tests.spark_plugin.test_rescale_threads import rescale_plan
from tests.spark_plugin.test_restore_threads import plan_from_acks
from tests.spark_plugin.test_subtask_threads import wait_for

SMALL = NetworkConfig(buffer_size=512, checkpoints_during_recovery=False)
DURING_RECOVERY = NetworkConfig(buffer_size=512)  # checkpoints during recovery: the default
COUNT = 6000

RELEASE = threading.Event()
"""Cleared: the keyed stage holds its next record until it is set (the threads share this module)."""
RELEASE.set()


def held_count(key, record, state):
    if not RELEASE.is_set():
        RELEASE.wait(60)
    time.sleep(0.0003)
    state.update((state.value() or 0) + 1)
    return [record]


def pipeline(keyed: int = 2) -> Pipeline:
    p = Pipeline("during-recovery", parallelism=2)
    (
        p.source(SequenceSource(count=COUNT, keys=16), id="src")
        .map(lambda r: r, id="parse")
        .key_by(lambda r: r[0])
        .process(held_count, id="slow", parallelism=keyed)
        .sink(CollectSink(), id="out")
    )
    return p


def barrier_came(subtask, checkpoint_id: int) -> bool:
    """The checkpoint's barrier is announced on the subtask's gate, or the subtask already acted on it (it came before
    the subtask took its first record)."""
    return bool(subtask.gate.priority) or subtask.handler.latest_checkpoint_id >= checkpoint_id


def fetch_from(coord: InMemoryCoordinator):
    def fetch(blob_id, start, end):
        data = coord.blobs[blob_id]
        return data if start is None else data[start : end + 1]

    return fetch


def stopped_mid_stream() -> InMemoryCoordinator:
    """A backpressured run that took unaligned checkpoint 1 and was stopped, as a failure would."""
    coord = InMemoryCoordinator()
    run = ThreadedRun(pipeline(), coord.reporter, coord.events, SMALL).start()
    wait_for(lambda: run.subtask("slow", 0).records_in > 600, "records to flow")
    coord.trigger(1, "unaligned")
    wait_for(lambda: len(coord.acks.get(1, {})) == 4, "checkpoint 1")
    coord.publish(JobStatusChanged(status="CANCELLED"))
    run.join(60)
    return coord


def checkpoint_during_replay(first: InMemoryCoordinator) -> InMemoryCoordinator:
    """Restore checkpoint 1, take checkpoint 2 while the keyed stage replays, then stop (a second failure)."""
    plan = plan_from_acks(first.acks[1])
    replaying = [i for i in range(2) if plan[("slow", i)]["input_channel_state"]]
    assert replaying, "checkpoint 1 holds no in-flight input of the keyed stage"
    coord = InMemoryCoordinator(expected_subtasks=4)
    RELEASE.clear()
    try:
        run = ThreadedRun(
            pipeline(), coord.reporter, coord.events, DURING_RECOVERY,
            restore=plan, fetch=fetch_from(first), restore_checkpoint=1,
        )
        coord.trigger(2, "unaligned")  # the sources take it on their first turn
        run.start()
        slow = [run.subtask("slow", i) for i in replaying]
        wait_for(lambda: all(barrier_came(s, 2) for s in slow), "checkpoint 2's barriers at the keyed stage")
    finally:
        RELEASE.set()
    wait_for(lambda: 2 in coord.completed, "checkpoint 2 to complete")
    coord.publish(JobStatusChanged(status="CANCELLED"))
    results = run.join(120)
    for res in results:
        if res.vertex == "slow" and res.subtask_index in replaying:
            taken = [c for c in res.checkpoints if c.get("checkpoint_id") == 2 and "aborted" not in c]
            assert taken and taken[0]["during_recovery"], f"slow {res.subtask_index}: {res.checkpoints}"
            assert taken[0]["persisted"] > 0, "the records not replayed yet are part of checkpoint 2"
    return coord


def test_a_checkpoint_taken_during_replay_restores_exactly_once_in_per_key_order():
    second = checkpoint_during_replay(stopped_mid_stream())

    third_coord = InMemoryCoordinator()
    third = ThreadedRun(
        pipeline(), third_coord.reporter, third_coord.events, SMALL,
        restore=plan_from_acks(second.acks[2]), fetch=fetch_from(second), restore_checkpoint=2,
    ).start()
    results = third.join(120)
    records = [r for res in results for out in res.outputs.values() if "records" in out for r in out["records"]]
    seqs = sorted(r[1] for r in records)
    assert seqs == list(range(COUNT)), (
        f"{len(seqs) - len(set(seqs))} duplicates, {len(set(range(COUNT)) - set(seqs))} missing"
    )
    for res in results:
        if res.vertex != "slow":
            continue
        by_stream: dict[tuple, list[int]] = {}
        for key, seq in res.outputs["out"]["records"]:
            by_stream.setdefault((key, seq % 2), []).append(seq)  # seq % 2 is the source subtask
        assert all(v == sorted(v) for v in by_stream.values()), "records of a key were reordered"


def test_without_the_option_a_barrier_during_replay_is_declined():
    first = stopped_mid_stream()
    plan = plan_from_acks(first.acks[1])
    replaying = [i for i in range(2) if plan[("slow", i)]["input_channel_state"]]
    assert replaying, "checkpoint 1 holds no in-flight input of the keyed stage"
    coord = InMemoryCoordinator(expected_subtasks=4)
    RELEASE.clear()
    try:
        run = ThreadedRun(
            pipeline(), coord.reporter, coord.events, SMALL,
            restore=plan, fetch=fetch_from(first), restore_checkpoint=1,
        )
        coord.trigger(2, "unaligned")
        run.start()
        slow = [run.subtask("slow", i) for i in replaying]
        wait_for(lambda: all(barrier_came(s, 2) for s in slow), "checkpoint 2's barriers at the keyed stage")
    finally:
        RELEASE.set()
    wait_for(lambda: 2 in coord.aborted, "checkpoint 2 to be declined")
    coord.publish(JobStatusChanged(status="CANCELLED"))
    run.join(120)
    assert any(d[0] == 2 and d[1] == "slow" and "replaying" in d[3] for d in coord.declines)


def test_a_subtask_whose_restore_moved_records_takes_no_checkpoint_while_it_replays():
    first = stopped_mid_stream()
    run = ThreadedRun(
        pipeline(keyed=3), first.reporter, first.events, DURING_RECOVERY,
        restore=rescale_plan(first.acks[1], "slow", 3), fetch=fetch_from(first), restore_checkpoint=1,
    )
    try:
        slow = [run.subtask("slow", i) for i in range(3)]
        moved = [s for s in slow if s.restore_stats.rerouted_records]
        assert moved, "the rescaled restore moved no record"
        assert all(s.checkpoints.recovering() for s in moved)  # declines barriers, reports running after the replay
    finally:
        for life in run.lives:
            life.close(5)
