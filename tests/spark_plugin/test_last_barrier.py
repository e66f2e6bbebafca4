"""unaligned_last_barrier: barriers overtake input queues, the snapshot waits for the last barrier, the barrier goes
on in band; so a subtask persists the inputs its barriers overtook and none of its outputs."""

from __future__ import annotations

from spark_plugin.network.barrier import CheckpointBarrier
from spark_plugin.network.channel_items import Buffer, HeldBarrier
from spark_plugin.network.input import InputGate
from spark_plugin.network.mailbox import Mailbox
from spark_plugin.plan.topology import ChannelInfo
from spark_plugin.task.barrier_states import CollectingLastBarrier, WaitingForFirstBarrier
from spark_plugin.task.barriers import BarrierHandler
from tests.spark_plugin.fakes import RecordingActions

POLICY = "unaligned_last_barrier"


def priority(cid: int) -> CheckpointBarrier:
    """A barrier that came as a priority event (from a source, which forwards so)."""
    return CheckpointBarrier(cid, trigger_timestamp=1_000, policy=POLICY, unaligned=True)


def in_band(cid: int) -> CheckpointBarrier:
    """A barrier that came behind the buffers (from a subtask that snapshotted on its last barrier)."""
    return CheckpointBarrier(cid, trigger_timestamp=1_000, policy=POLICY)


def handler(channels: int = 3) -> tuple[BarrierHandler, RecordingActions]:
    actions = RecordingActions(channels)
    return BarrierHandler(actions), actions


# ------------------------------------------------------------------------------------------------ barrier states


def test_a_priority_barrier_blocks_its_channel_ahead_of_what_it_overtook_and_takes_no_snapshot():
    h, a = handler(3)
    h.on_barrier(1, priority(1))
    assert isinstance(h.state, CollectingLastBarrier)
    assert a.take() == [("block_overtaken", 1, 1)]


def test_channels_without_a_barrier_keep_being_processed_until_the_last_barrier():
    h, a = handler(3)
    h.on_barrier(1, priority(1))
    h.on_barrier(0, priority(1))
    assert a.take() == [("block_overtaken", 1, 1), ("block_overtaken", 0, 1)]  # channel 2 is never blocked
    assert h.pending_checkpoint == 1


def test_the_last_barrier_snapshots_persists_what_each_barrier_overtook_and_forwards_in_band():
    h, a = handler(3)
    h.on_barrier(1, priority(1))
    h.on_barrier(0, priority(1))
    a.take()
    h.on_barrier(2, priority(1))
    assert a.take() == [
        ("snapshot", 1, True),
        ("record", 0, 1),
        ("stop_record", 0),
        ("record", 1, 1),
        ("stop_record", 1),
        ("record", 2, 1),
        ("stop_record", 2),
        ("forward", 1, False),
        ("unblock_all",),
        ("finish_input", 1),
    ]
    assert isinstance(h.state, WaitingForFirstBarrier)


def test_a_barrier_in_band_blocks_where_it_is_and_nothing_of_its_channel_is_persisted():
    h, a = handler(2)
    h.on_barrier(0, in_band(1))
    assert a.take() == [("block", 0)]
    h.on_barrier(1, priority(1))
    assert a.take() == [
        ("snapshot", 1, True),
        ("record", 1, 1),
        ("stop_record", 1),
        ("forward", 1, False),
        ("unblock_all",),
        ("finish_input", 1),
    ]


def test_all_barriers_in_band_is_an_aligned_checkpoint():
    h, a = handler(2)
    h.on_barrier(0, in_band(1))
    h.on_barrier(1, in_band(1))
    assert a.take() == [
        ("block", 0),
        ("snapshot", 1, False),
        ("forward", 1, False),
        ("unblock_all",),
        ("finish_input", 1),
    ]


def test_a_source_snapshots_on_the_trigger_and_forwards_with_priority():
    h, a = handler(0)
    h.on_trigger(in_band(3))
    assert a.take() == [("snapshot", 3, True), ("forward", 3, True), ("finish_input", 3)]


def test_a_channel_that_ends_counts_as_arrived():
    h, a = handler(2)
    h.on_barrier(0, priority(1))
    a.take()
    a.ended.add(1)
    h.on_channel_ended(1)
    assert a.take()[:3] == [("snapshot", 1, True), ("record", 0, 1), ("stop_record", 0)]


def test_a_late_duplicate_barrier_changes_nothing():
    h, a = handler(2)
    h.on_barrier(0, priority(1))
    a.take()
    h.on_barrier(0, priority(1))
    assert a.take() == []


def test_the_switch_to_unaligned_and_the_alignment_timer_change_nothing():
    h, a = handler(2)
    h.on_barrier(0, priority(1))
    a.take()
    h.on_switch_to_unaligned(1)
    h.on_timer(10**12)
    assert a.take() == [] and h.pending_checkpoint == 1


def test_an_abort_unblocks_and_declines_without_a_snapshot():
    h, a = handler(2)
    h.on_barrier(0, priority(1))
    a.take()
    h.on_abort(1, "expired")
    assert a.take() == [("unblock_all",), ("abort", 1, "expired")]
    h.on_barrier(1, priority(1))
    assert a.take() == []


def test_a_newer_checkpoint_supersedes_an_unfinished_one():
    h, a = handler(2)
    h.on_barrier(0, priority(1))
    a.take()
    h.on_barrier(1, priority(2))
    calls = a.take()
    assert calls[0] == ("unblock_all",)
    assert calls[1][:2] == ("abort", 1) and "superseded by checkpoint 2" in calls[1][2]
    assert calls[2:] == [("block_overtaken", 1, 2)]


def test_a_savepoint_of_the_policy_is_aligned():
    h, a = handler(2)
    h.on_barrier(0, CheckpointBarrier(1, 1_000, policy=POLICY, is_savepoint=True))
    assert a.take() == [("block", 0)]


# ------------------------------------------------------------------------------------------------ the gate


def _gate() -> InputGate:
    return InputGate([ChannelInfo(f"in:a[{i}]->b[0]", "input") for i in range(2)], 2, 0, Mailbox())


def test_blocking_at_a_priority_barrier_keeps_the_overtaken_buffers_queued_and_findable():
    gate = _gate()
    ch0 = gate.channels[0]
    ch0.items.append(Buffer(b"a"))
    barrier = priority(1)
    gate._queue_priority(ch0, barrier)
    ch0.items.append(Buffer(b"after"))
    gate.block_at_priority(0, 1)
    gate.priority_done(0, barrier)  # the loop finishing the announcement: the held marker stays
    assert gate.next_priority() is None
    assert [type(item) for item in ch0.items] == [Buffer, HeldBarrier, Buffer]
    assert gate.poll() is None  # blocked: not even the overtaken buffer is processed before the snapshot
    assert ch0.buffers_before(1) == [b"a"]


def test_once_unblocked_the_overtaken_buffers_come_first_and_the_held_marker_is_dropped():
    gate = _gate()
    ch0 = gate.channels[0]
    ch0.items.append(Buffer(b"a"))
    gate._queue_priority(ch0, priority(1))
    ch0.items.append(Buffer(b"after"))
    gate.block_at_priority(0, 1)
    gate.unblock_all()
    assert gate.poll()[1] == Buffer(b"a")
    assert gate.poll()[1] == Buffer(b"after")
    assert not ch0.items
