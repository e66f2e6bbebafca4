"""Concurrent unaligned checkpoints (``max_concurrent`` > 1): barrier states driven by scripted events, and a subtask
whose two checkpoints are in flight at once, each recording exactly its own buffers (no sockets, no Spark)."""

from __future__ import annotations

import pickle

from spark_plugin import Pipeline
from spark_plugin.connectors import CollectSink, SequenceSource
from spark_plugin.network.barrier import CheckpointBarrier
from spark_plugin.network.channel_items import Buffer
from spark_plugin.network.framing import decode_records, encode_records
from spark_plugin.task.barrier_states import CollectingUnaligned, WaitingForFirstBarrier
from spark_plugin.task.barriers import BarrierHandler
from spark_plugin.task.channel_state import ChannelStateReader
from tests.spark_plugin.fakes import InMemoryCoordinator, RecordingActions
from tests.spark_plugin.test_subtask_scripted import build


def unaligned(cid: int, max_concurrent: int = 2) -> CheckpointBarrier:
    return CheckpointBarrier(cid, 1_000, "unaligned", unaligned=True, max_concurrent=max_concurrent)


def aligned(cid: int, max_concurrent: int = 2) -> CheckpointBarrier:
    return CheckpointBarrier(cid, 1_000, "aligned", max_concurrent=max_concurrent)


def handler(channels: int = 2) -> tuple[BarrierHandler, RecordingActions]:
    actions = RecordingActions(channels)
    return BarrierHandler(actions), actions


# ------------------------------------------------------------------------------------------------ barrier states


def test_a_newer_unaligned_barrier_starts_its_checkpoint_beside_the_older_one():
    h, a = handler(2)
    h.on_barrier(0, unaligned(1))
    a.take()
    h.on_barrier(0, unaligned(2))
    assert a.take() == [
        ("snapshot", 2, True), ("forward", 2, True), ("record", 0, 2), ("record", 1, 2), ("stop_record", 0),
    ]
    assert h.in_progress == [1, 2]
    assert isinstance(h.older[1], CollectingUnaligned) and h.pending_checkpoint == 2


def test_interleaved_barriers_on_two_channels_finish_both_checkpoints_in_order():
    h, a = handler(2)
    h.on_barrier(0, unaligned(1))
    h.on_barrier(0, unaligned(2))
    a.take()
    h.on_barrier(1, unaligned(1))
    assert a.take() == [("stop_record", 1), ("finish_input", 1)]
    assert h.in_progress == [2]
    h.on_barrier(1, unaligned(2))
    assert a.take() == [("stop_record", 1), ("finish_input", 2)]
    assert h.in_progress == [] and isinstance(h.state, WaitingForFirstBarrier)


def test_a_channel_that_ends_stops_persisting_for_every_checkpoint_in_progress():
    h, a = handler(2)
    h.on_barrier(0, unaligned(1))
    h.on_barrier(0, unaligned(2))
    a.take()
    a.ended.add(1)
    h.on_channel_ended(1)
    assert a.take() == [("stop_record", 1), ("finish_input", 1), ("stop_record", 1), ("finish_input", 2)]


def test_beyond_max_concurrent_the_oldest_checkpoint_is_declined():
    h, a = handler(2)
    h.on_barrier(0, unaligned(1))
    h.on_barrier(0, unaligned(2))
    a.take()
    h.on_barrier(0, unaligned(3))
    calls = a.take()
    assert calls[0] == ("stop_record", 1)
    assert calls[1][:2] == ("abort", 1) and "more than max_concurrent=2" in calls[1][2]
    assert calls[2][:2] == ("snapshot", 3)
    assert h.in_progress == [2, 3]


def test_an_aligned_barrier_keeps_one_checkpoint_at_a_time():
    h, a = handler(2)
    h.on_barrier(0, unaligned(1))
    a.take()
    h.on_barrier(0, aligned(2))
    calls = a.take()
    assert calls[0] == ("stop_record", 1) and calls[1][:2] == ("abort", 1)
    assert calls[2:] == [("block", 0)]
    assert h.in_progress == [2]


def test_a_newer_unaligned_barrier_still_supersedes_an_aligned_checkpoint_in_progress():
    h, a = handler(2)
    h.on_barrier(0, aligned(1))
    a.take()
    h.on_barrier(1, unaligned(2))
    calls = a.take()
    assert calls[0] == ("unblock_all",) and calls[1][:2] == ("abort", 1)
    assert h.in_progress == [2]


def test_with_max_concurrent_1_a_newer_barrier_supersedes_the_older_unaligned_checkpoint():
    h, a = handler(2)
    h.on_barrier(0, unaligned(1, max_concurrent=1))
    a.take()
    h.on_barrier(0, unaligned(2, max_concurrent=1))
    calls = a.take()
    assert calls[0] == ("stop_record", 1) and "superseded by checkpoint 2" in calls[1][2]
    assert h.older == {} and h.in_progress == [2]


def test_the_coordinator_aborting_the_older_checkpoint_leaves_the_newer_one_going():
    h, a = handler(2)
    h.on_barrier(0, unaligned(1))
    h.on_barrier(0, unaligned(2))
    a.take()
    h.on_abort(1, "expired")
    assert a.take() == [("stop_record", 1), ("abort", 1, "expired")]
    assert h.in_progress == [2]
    h.on_barrier(1, unaligned(1))  # its late barrier changes nothing
    assert a.take() == []


def test_a_barrier_leaves_max_concurrent_off_the_wire_at_one():
    assert b"max_concurrent" not in unaligned(1, max_concurrent=1).encode()
    assert CheckpointBarrier.decode(unaligned(1, max_concurrent=3).encode()).max_concurrent == 3


# ------------------------------------------------------------------------------------------------ a scripted subtask


def two_input_subtask(coord: InMemoryCoordinator):
    p = Pipeline("scripted-concurrent")
    p.source(SequenceSource(count=1), id="src", parallelism=2).rebalance().map(str, id="m", parallelism=1).sink(
        CollectSink(), id="out"
    )
    return build("m", p, coord)


def test_two_checkpoints_in_flight_each_record_exactly_their_buffers_and_are_consistent_cuts():
    coord = InMemoryCoordinator()
    st = two_input_subtask(coord)
    a, b = st.gate.channels
    bufs = {name: encode_records([f"{name}{i}" for i in range(3)]) for name in ("a1", "a2", "b1", "b2", "b3", "b4")}

    def data(ch, *names):
        with st.lock:
            for name in names:
                ch.items.append(Buffer(bufs[name]))

    def barrier(ch, cid):
        with st.lock:
            st.gate._queue_priority(ch, unaligned(cid))
        st._handle_priority()

    def process_one():
        assert st._take_input()
        st._process_current()

    data(a, "a1", "a2")
    data(b, "b1", "b2")
    barrier(a, 1)  # checkpoint 1 snapshots; it overtakes a1, a2 on channel a and waits on channel b
    while "b10" not in st.chain.operators[-1].sink.records:
        process_one()  # round robin: a1, then b1 (persisted for checkpoint 1 only)
    barrier(a, 2)  # checkpoint 2 snapshots; it overtakes what channel a still queues
    while st._step():
        pass  # everything queued is processed: b2 goes into both recordings
    data(b, "b3")
    with st.lock:
        st.gate._queue_priority(b, unaligned(1))
        b.items.append(Buffer(bufs["b4"]))
        st.gate._queue_priority(b, unaligned(2))
        barrier_b1_overtakes = list(b.buffers_before(1))
    st._handle_priority()
    while st._step():
        pass
    st.checkpoints.hand_over_ready()
    st.ack_worker.close()
    assert barrier_b1_overtakes == [bufs["b3"]]

    def recorded(cid: int) -> tuple[list, dict[str, list[bytes]]]:
        ack = coord.acks[cid][("m", 0)]
        state = pickle.loads(coord.blobs[ack["operator_state"]["blob_id"]])["operators"]["out"]["records"]
        reader = ChannelStateReader(coord.blobs[ack["channel_state"]["blob_id"]])
        return state, {seg["channel"]: reader.segment_buffers(seg) for seg in ack["channel_segments"]}

    state1, inflight1 = recorded(1)
    state2, inflight2 = recorded(2)
    processed_a_before_2 = [n for n in ("a1", "a2") if f"{n}0" in state2]
    assert state1 == []
    assert inflight1 == {
        "in:src[0]->m[0]": [bufs["a1"], bufs["a2"]],
        "in:src[1]->m[0]": [bufs["b1"], bufs["b2"], bufs["b3"]],
    }
    assert inflight2 == {
        "in:src[0]->m[0]": [bufs[n] for n in ("a1", "a2") if n not in processed_a_before_2],
        "in:src[1]->m[0]": [bufs["b2"], bufs["b3"], bufs["b4"]],
    }
    everything = sorted(r for buf in bufs.values() for r in decode_records(buf))
    before_1 = sorted(r for name, buf in bufs.items() if name != "b4" for r in decode_records(buf))
    for cut, state, inflight in ((before_1, state1, inflight1), (everything, state2, inflight2)):
        persisted = [r for bs in inflight.values() for buf in bs for r in decode_records(buf)]
        assert sorted(state + persisted) == cut  # a consistent cut: what came before its barriers, each record once
    assert sorted(st.chain.operators[-1].sink.records) == everything


def ready(st, cid: int) -> None:
    with st.lock:
        st.writer.finish_input(cid)
        st.writer.finish_output(cid)


def test_a_newer_concurrent_checkpoint_ready_first_waits_for_the_older_one_to_be_handed_over():
    coord = InMemoryCoordinator()
    st = two_input_subtask(coord)
    for cid in (1, 2):
        st.checkpoints.snapshot(unaligned(cid), True, 1_000)
    ready(st, 2)
    st.checkpoints.hand_over_ready()
    assert sorted(st.checkpoints.pending) == [1, 2]  # 2 is complete, but 1 is acknowledged first
    ready(st, 1)
    st.checkpoints.hand_over_ready()
    st.ack_worker.close()
    assert st.checkpoints.pending == {} and sorted(coord.acks) == [1, 2]
    assert [e["checkpoint_id"] for e in st.checkpoints.log] == [1, 2]


def test_one_at_a_time_checkpoints_are_handed_over_as_they_are_ready():
    coord = InMemoryCoordinator()
    st = two_input_subtask(coord)
    for cid in (1, 2):
        st.checkpoints.snapshot(unaligned(cid, max_concurrent=1), True, 1_000)
    ready(st, 2)
    st.checkpoints.hand_over_ready()
    assert sorted(st.checkpoints.pending) == [1]
    st.ack_worker.close()
