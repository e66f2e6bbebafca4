"""Barrier handling, state by state, driven by scripted channel events (no sockets, no Spark)."""

from __future__ import annotations

from spark_plugin.network.barrier import CheckpointBarrier
from spark_plugin.task.barrier_states import (
    CollectingAligned,
    CollectingAlignedOverBudget,
    CollectingAlignedUntilTimeout,
    CollectingUnaligned,
    WaitingForFirstBarrier,
)
from spark_plugin.task.barriers import BarrierHandler
from tests.spark_plugin.fakes import RecordingActions


def aligned(cid: int) -> CheckpointBarrier:
    return CheckpointBarrier(cid, trigger_timestamp=1_000, policy="aligned")


def unaligned(cid: int) -> CheckpointBarrier:
    return CheckpointBarrier(cid, trigger_timestamp=1_000, policy="unaligned", unaligned=True)


def timeout_barrier(cid: int, timeout: int = 500) -> CheckpointBarrier:
    return CheckpointBarrier(cid, trigger_timestamp=1_000, policy="aligned_then_unaligned", alignment_timeout=timeout)


def handler(channels: int = 3) -> tuple[BarrierHandler, RecordingActions]:
    actions = RecordingActions(channels)
    return BarrierHandler(actions), actions


# ------------------------------------------------------------------------------------------------ aligned


def test_aligned_blocks_each_channel_until_all_barriers_arrived_then_snapshots_and_forwards_at_the_tail():
    h, a = handler(3)
    h.on_barrier(0, aligned(1))
    h.on_barrier(2, aligned(1))
    assert isinstance(h.state, CollectingAligned)
    assert a.take() == [("block", 0), ("block", 2)]
    h.on_barrier(1, aligned(1))
    assert a.take() == [("snapshot", 1, False), ("forward", 1, False), ("unblock_all",), ("finish_input", 1)]
    assert isinstance(h.state, WaitingForFirstBarrier)


def test_aligned_with_one_channel_completes_on_its_barrier():
    h, a = handler(1)
    h.on_barrier(0, aligned(4))
    assert a.take() == [("snapshot", 4, False), ("forward", 4, False), ("unblock_all",), ("finish_input", 4)]


def test_aligned_ignores_late_barriers_of_older_checkpoints():
    h, a = handler(2)
    h.on_barrier(0, aligned(2))
    h.on_barrier(1, aligned(2))
    a.take()
    h.on_barrier(0, aligned(1))
    h.on_barrier(0, aligned(2))
    assert a.take() == []
    assert isinstance(h.state, WaitingForFirstBarrier)


def test_newer_barrier_supersedes_an_unfinished_aligned_checkpoint():
    h, a = handler(2)
    h.on_barrier(0, aligned(1))
    a.take()
    h.on_barrier(1, aligned(2))
    calls = a.take()
    assert calls[0] == ("unblock_all",)
    assert calls[1][:2] == ("abort", 1) and "superseded by checkpoint 2" in calls[1][2]
    assert calls[2:] == [("block", 1)]
    assert h.pending_checkpoint == 2
    h.on_barrier(0, aligned(1))  # the old barrier arriving late changes nothing
    assert a.take() == []


def test_aligned_channel_that_ends_counts_as_arrived():
    h, a = handler(2)
    h.on_barrier(0, aligned(1))
    a.take()
    a.ended.add(1)  # as the subtask marks its input channel ended
    h.on_channel_ended(1)
    assert a.take() == [("snapshot", 1, False), ("forward", 1, False), ("unblock_all",), ("finish_input", 1)]


def test_coordinator_abort_of_the_aligning_checkpoint_unblocks_and_discards():
    h, a = handler(2)
    h.on_barrier(0, aligned(1))
    a.take()
    h.on_abort(1, "timeout")
    assert a.take() == [("unblock_all",), ("abort", 1, "timeout")]
    h.on_barrier(1, aligned(1))
    assert a.take() == []


# ------------------------------------------------------------------------------------------------ unaligned


def test_unaligned_snapshots_on_the_first_barrier_and_forwards_with_priority():
    h, a = handler(3)
    h.on_barrier(1, unaligned(1))
    assert a.take() == [
        ("snapshot", 1, True),
        ("forward", 1, True),
        ("record", 0, 1),
        ("record", 1, 1),
        ("record", 2, 1),
        ("stop_record", 1),
    ]
    assert isinstance(h.state, CollectingUnaligned)


def test_unaligned_records_each_remaining_channel_until_its_barrier_and_never_blocks():
    h, a = handler(3)
    h.on_barrier(1, unaligned(1))
    a.take()
    h.on_barrier(0, unaligned(1))
    assert a.take() == [("stop_record", 0)]
    h.on_barrier(0, unaligned(1))  # duplicate: nothing
    h.on_barrier(2, unaligned(1))
    assert a.take() == [("stop_record", 2), ("finish_input", 1)]
    assert isinstance(h.state, WaitingForFirstBarrier)


def test_unaligned_policy_barrier_starts_unaligned_even_without_the_priority_flag():
    h, a = handler(1)
    h.on_barrier(0, CheckpointBarrier(3, 1_000, "unaligned"))
    assert a.take()[:2] == [("snapshot", 3, True), ("forward", 3, True)]


def test_newer_barrier_supersedes_an_unfinished_unaligned_checkpoint():
    h, a = handler(2)
    h.on_barrier(0, unaligned(1))
    a.take()
    h.on_barrier(1, unaligned(2))
    calls = a.take()
    assert calls[0] == ("stop_record", 1)
    assert calls[1][:2] == ("abort", 1)
    assert calls[2:4] == [("snapshot", 2, True), ("forward", 2, True)]
    assert h.pending_checkpoint == 2


def test_unaligned_channel_that_ends_stops_recording_and_completes_the_input():
    h, a = handler(2)
    h.on_barrier(0, unaligned(1))
    a.take()
    a.ended.add(1)  # as the subtask marks its input channel ended
    h.on_channel_ended(1)
    assert a.take() == [("stop_record", 1), ("finish_input", 1)]


def test_savepoint_is_aligned_whatever_its_policy():
    h, a = handler(2)
    h.on_barrier(0, CheckpointBarrier(9, 1_000, "unaligned", is_savepoint=True))
    assert a.take() == [("block", 0)]


# ------------------------------------------------------------------------------------------------ aligned_then_unaligned


def test_aligned_then_unaligned_stays_aligned_before_the_timeout():
    h, a = handler(2)
    h.on_barrier(0, timeout_barrier(1, timeout=500))
    assert isinstance(h.state, CollectingAlignedUntilTimeout)
    assert h.deadline() == 1_500
    h.on_timer(1_499)
    assert a.take() == [("block", 0)]
    h.on_barrier(1, timeout_barrier(1))
    assert a.take() == [("snapshot", 1, False), ("forward", 1, False), ("unblock_all",), ("finish_input", 1)]


def test_aligned_then_unaligned_switches_at_trigger_time_plus_timeout():
    h, a = handler(3)
    h.on_barrier(0, timeout_barrier(1, timeout=500))
    a.take()
    h.on_timer(1_500)
    assert a.take() == [
        ("snapshot", 1, True),
        ("forward", 1, True),
        ("unblock_all",),
        ("record", 1, 1),
        ("record", 2, 1),
    ]
    assert isinstance(h.state, CollectingUnaligned)
    h.on_barrier(1, timeout_barrier(1))
    h.on_barrier(2, timeout_barrier(1))
    assert a.take() == [("stop_record", 1), ("stop_record", 2), ("finish_input", 1)]


def test_timeout_is_counted_from_the_trigger_time_not_from_the_first_barrier():
    h, a = handler(2)
    a.now = 1_600  # the barrier arrives after trigger time + timeout already passed
    h.on_barrier(0, timeout_barrier(1, timeout=500))
    assert a.take()[:2] == [("snapshot", 1, True), ("forward", 1, True)]


def test_coordinator_switch_event_is_obeyed_during_alignment():
    h, a = handler(2)
    h.on_barrier(0, timeout_barrier(1, timeout=60_000))
    a.take()
    h.on_switch_to_unaligned(2)  # another checkpoint: ignored
    assert a.take() == []
    h.on_switch_to_unaligned(1)
    assert a.take() == [("snapshot", 1, True), ("forward", 1, True), ("unblock_all",), ("record", 1, 1)]


def test_coordinator_switch_event_before_the_first_barrier_makes_it_start_unaligned():
    h, a = handler(2)
    h.on_switch_to_unaligned(1)
    h.on_barrier(0, timeout_barrier(1, timeout=60_000))
    assert a.take()[:2] == [("snapshot", 1, True), ("forward", 1, True)]


def test_priority_barrier_from_an_upstream_that_timed_out_switches_this_subtask():
    h, a = handler(3)
    h.on_barrier(0, timeout_barrier(1, timeout=60_000))
    a.take()
    h.on_barrier(1, timeout_barrier(1, timeout=60_000).as_unaligned())
    assert a.take() == [
        ("snapshot", 1, True),
        ("forward", 1, True),
        ("unblock_all",),
        ("record", 1, 1),
        ("record", 2, 1),
        ("stop_record", 1),
    ]


# ------------------------------------------------------------------------------------------------ sources


def test_source_trigger_snapshots_and_emits_aligned_barrier_at_the_tail():
    h, a = handler(0)
    h.on_trigger(aligned(1))
    assert a.take() == [("snapshot", 1, False), ("forward", 1, False), ("finish_input", 1)]


def test_source_trigger_of_an_unaligned_checkpoint_emits_a_priority_barrier():
    h, a = handler(0)
    h.on_trigger(CheckpointBarrier(2, 1_000, "unaligned"))
    assert a.take() == [("snapshot", 2, True), ("forward", 2, True), ("finish_input", 2)]


def test_source_ignores_a_trigger_of_an_aborted_checkpoint():
    h, a = handler(0)
    h.on_abort(3, "declined")
    h.on_trigger(aligned(3))
    assert a.take() == []


# ------------------------------------------------------------------------------------------------ in-flight budget


def budgeted(cid: int, budget: int, over: str = "align", **kw) -> CheckpointBarrier:
    fields = {"policy": "unaligned", "unaligned": True} | kw
    return CheckpointBarrier(cid, trigger_timestamp=1_000, inflight_budget=budget, over_inflight_budget=over, **fields)


def test_unaligned_within_its_inflight_budget_is_taken_unaligned():
    h, a = handler(2)
    a.inflight = {0: 100, 1: 100, -1: 50}
    h.on_barrier(1, budgeted(1, 250))
    assert a.take() == [
        ("snapshot", 1, True), ("forward", 1, True), ("record", 0, 1), ("record", 1, 1), ("stop_record", 1),
    ]


def test_unaligned_over_its_inflight_budget_holds_the_barriers_and_finishes_aligned():
    h, a = handler(2)
    a.inflight = {0: 100, 1: 100, -1: 51}
    h.on_barrier(1, budgeted(1, 250))
    assert a.take() == [("hold", 1, 251)]  # no snapshot, nothing persisted; the announced barrier waits in band
    assert isinstance(h.state, CollectingAlignedOverBudget)
    h.on_barrier(1, budgeted(1, 250).as_aligned())  # the subtask reached the held marker in channel 1
    assert a.take() == [("block", 1)]
    h.on_barrier(0, budgeted(1, 250).as_aligned())
    assert a.take() == [("snapshot", 1, False), ("forward", 1, False), ("unblock_all",), ("finish_input", 1)]
    assert isinstance(h.state, WaitingForFirstBarrier)


def test_over_budget_ignores_priority_announcements_and_the_coordinators_switch():
    h, a = handler(2)
    a.inflight = {0: 1_000}
    h.on_barrier(1, budgeted(1, 10, policy="aligned_then_unaligned", alignment_timeout=0))
    a.take()
    h.on_barrier(0, budgeted(1, 10))  # an announcement that raced the hold
    h.on_switch_to_unaligned(1)
    h.on_timer(10_000)
    assert a.take() == []
    assert isinstance(h.state, CollectingAlignedOverBudget)


def test_over_budget_with_abort_declines_the_checkpoint_naming_bytes_and_budget():
    h, a = handler(2)
    a.inflight = {0: 300}
    h.on_barrier(1, budgeted(1, 250, over="abort"))
    calls = a.take()
    assert calls[0] == ("unblock_all",)
    assert calls[1][:2] == ("abort", 1) and "300 bytes" in calls[1][2] and "budget of 250 bytes" in calls[1][2]
    assert calls[2:] == []
    h.on_barrier(0, budgeted(1, 250, over="abort"))  # its other barriers are late
    assert a.take() == []


def test_alignment_timeout_over_budget_stays_aligned_counting_only_channels_still_aligning():
    h, a = handler(3)
    a.inflight = {0: 5_000, 1: 10, 2: 10}
    barrier = budgeted(1, 100, policy="aligned_then_unaligned", alignment_timeout=500, unaligned=False)
    h.on_barrier(0, barrier)  # channel 0 is blocked: what it queues is after the cut and never persisted
    a.take()
    h.on_timer(1_500)
    assert a.take()[0] == ("snapshot", 1, True)  # 20 bytes in channels 1 and 2: within the budget, it switches

    h2, a2 = handler(3)
    a2.inflight = {0: 10, 1: 500, 2: 10}
    h2.on_barrier(0, barrier)
    a2.take()
    h2.on_timer(1_500)
    assert a2.take() == [("hold", 1, 510)]
    assert isinstance(h2.state, CollectingAlignedOverBudget)
    h2.on_barrier(1, barrier)
    h2.on_barrier(2, barrier)
    assert a2.take() == [
        ("block", 1), ("snapshot", 1, False), ("forward", 1, False), ("unblock_all",), ("finish_input", 1),
    ]


def test_upstream_priority_barrier_over_budget_keeps_the_alignment():
    h, a = handler(2)
    a.inflight = {1: 400}
    h.on_barrier(0, budgeted(1, 100, policy="aligned_then_unaligned", alignment_timeout=500, unaligned=False))
    a.take()
    h.on_barrier(1, budgeted(1, 100, policy="aligned_then_unaligned", alignment_timeout=500))
    assert a.take() == [("hold", 1, 400)]
    h.on_barrier(1, budgeted(1, 100, policy="aligned_then_unaligned", alignment_timeout=500, unaligned=False))
    assert a.take() == [("snapshot", 1, False), ("forward", 1, False), ("unblock_all",), ("finish_input", 1)]


def test_source_over_budget_sends_its_barrier_in_band():
    h, a = handler(0)
    a.inflight = {-1: 4_096}
    h.on_trigger(CheckpointBarrier(2, 1_000, "unaligned", inflight_budget=1_024))
    assert a.take() == [("hold", 2, 4_096), ("snapshot", 2, False), ("forward", 2, False), ("finish_input", 2)]
