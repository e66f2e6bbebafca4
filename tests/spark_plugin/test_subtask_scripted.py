"""The subtask loop's barrier actions, driven step by step with scripted channel contents (no sockets)."""

from __future__ import annotations

import pickle

from contract.events import CheckpointCompleted
from spark_plugin import Pipeline
from spark_plugin.connectors import CollectSink, SequenceSource
from spark_plugin.network.barrier import CheckpointBarrier
from spark_plugin.network.channel_items import END, RECOVERY_END, Barrier, Buffer, PriorityBarrier
from spark_plugin.network.config import NetworkConfig
from spark_plugin.network.framing import encode_records
from spark_plugin.network.output_items import OutBarrier, OutPriorityBarrier
from spark_plugin.plan.topology import subtask_specs
from spark_plugin.task.channel_state import ChannelStateReader
from spark_plugin.task.life import build_subtask
from tests.spark_plugin.consistency import emitted
from tests.spark_plugin.fakes import InMemoryCoordinator

BARRIER = CheckpointBarrier(1, trigger_timestamp=0, policy="unaligned", unaligned=True)
INJECT: list = []


def inject_on_third(record):
    """Map function: when record 2 is processed, a priority barrier arrives (as the network thread would)."""
    if record == 2 and INJECT:
        INJECT.pop()()
    return record


def build(vertex: str, p: Pipeline, coord: InMemoryCoordinator):
    plan = p.plan()
    spec = next(s for s in subtask_specs(plan) if s.vertex == vertex)
    return build_subtask(plan, spec, coord.reporter(spec), None, NetworkConfig(buffer_size=64))


def sink_pipeline() -> Pipeline:
    p = Pipeline("scripted")
    p.source(SequenceSource(count=1), id="src").rebalance().map(inject_on_third, id="m").sink(CollectSink(), id="out")
    return p


def test_priority_barrier_is_taken_between_records_and_the_unread_rest_of_the_buffer_is_persisted():
    coord = InMemoryCoordinator()
    st = build("m", sink_pipeline(), coord)
    ch = st.gate.channels[0]
    first, second = encode_records(range(10)), encode_records(range(10, 15))
    ch.items.extend([Buffer(first), Buffer(second)])

    def arrive():
        ch.items.append(PriorityBarrier(BARRIER))
        st.gate.priority.append((0, BARRIER))

    INJECT.append(arrive)
    assert st._take_input()  # takes the first buffer
    st._process_current()  # processes records 0, 1, 2, then sees the priority barrier
    assert st.records_in == 3
    st._handle_priority()
    while st._step():
        pass
    st.checkpoints.hand_over_ready()
    st.ack_worker.close()
    ack = coord.acks[1][("m", 0)]
    state = pickle.loads(coord.blobs[ack["operator_state"]["blob_id"]])["operators"]["out"]
    assert state["records"] == [0, 1, 2]
    reader = ChannelStateReader(coord.blobs[ack["channel_state"]["blob_id"]])
    (segment,) = ack["channel_segments"]
    assert segment["channel"] == "in:src[0]->m[0]" and segment["direction"] == "input"
    assert reader.segment_buffers(segment) == [encode_records(range(3, 10)), second]
    assert first.endswith(reader.segment_buffers(segment)[0])  # a byte range of the buffer that travelled
    assert st.chain.operators[-1].sink.records == list(range(15))  # and everything is still processed


def test_a_checkpoint_that_becomes_ready_mid_buffer_is_handed_over_before_the_rest_of_the_buffer():
    """An output channel's sender thread sends the last barrier of a checkpoint while the loop works through a
    buffer of slow records: the loop stops after the record in hand and hands the checkpoint over, instead of
    acking it only once the whole buffer (hundreds of records) is processed."""
    coord = InMemoryCoordinator()
    st = build("m", sink_pipeline(), coord)
    ch = st.gate.channels[0]
    ch.items.append(Buffer(encode_records(range(10))))
    states = st.checkpoints.writer
    states.start(7)
    states.finish_input(7)
    assert not states.newly_ready  # only one side of checkpoint 7 is complete
    INJECT.append(lambda: states.finish_output(7))  # at record 2, as the sender thread would
    assert st._take_input()
    st._process_current()
    assert st.records_in == 3 and states.newly_ready
    st.checkpoints.hand_over_ready()  # the loop's next turn
    assert not states.newly_ready
    st._process_current()  # nothing new is ready: the rest of the buffer in one go
    assert st.records_in == 10
    states.abort(7)


def test_priority_barrier_overtakes_queued_output_buffers_and_persists_them_as_output_state():
    coord = InMemoryCoordinator()
    p = Pipeline("scripted-out")
    p.source(SequenceSource(count=1000), id="src").rebalance().map(str, id="m").sink(CollectSink(), id="out")
    st = build("src", p, coord)
    while st.partition.available():
        st._read_source()  # no receiver attached: the buffers stay queued
    queued = [item.data for item in st.partition.channels[0].queue]
    st.handler.on_trigger(CheckpointBarrier(1, 0, "unaligned"))
    with st.lock:
        st.partition.channels[0].queue.popleft()  # the sender takes the barrier first
        st.partition._barrier_sent(1)
    st.checkpoints.hand_over_ready()
    st.ack_worker.close()
    ack = coord.acks[1][("src", 0)]
    (segment,) = ack["channel_segments"]
    assert segment["direction"] == "output" and segment["channel"] == "out:src[0]->m[0]"
    persisted = ChannelStateReader(coord.blobs[ack["channel_state"]["blob_id"]]).segment_buffers(segment)
    # the queued buffers, then the partly filled buffer that was flushed in front of the barrier
    assert persisted[: len(queued)] == queued and len(persisted) == len(queued) + 1
    n_emitted = emitted(ack["source_offsets"])
    records = [r for b in persisted for r in pickle_records(b)]
    assert [r[1] for r in records] == list(range(n_emitted))  # nothing was sent: all emitted is output state


def pickle_records(buffer: bytes) -> list:
    from spark_plugin.network.framing import decode_records

    return decode_records(buffer)


def test_aligned_barrier_in_a_queue_past_the_timeout_is_converted_and_what_it_overtook_persisted():
    coord = InMemoryCoordinator()
    p = Pipeline("scripted-convert")
    p.source(SequenceSource(count=1000), id="src").rebalance().map(str, id="m").sink(CollectSink(), id="out")
    st = build("src", p, coord)
    while st.partition.available():
        st._read_source()
    queued = [item.data for item in st.partition.channels[0].queue]
    now = st.checkpoints.now_ms()
    st.handler.on_trigger(CheckpointBarrier(1, now, "aligned_then_unaligned", alignment_timeout=60_000))
    assert type(st.partition.channels[0].queue[-1]) is OutBarrier  # aligned: at the tail
    st._on_timers()
    assert type(st.partition.channels[0].queue[-1]) is OutBarrier  # before the deadline nothing changes
    st.checkpoints.pending[1].barrier = CheckpointBarrier(1, now - 60_000, "aligned_then_unaligned", alignment_timeout=60_000)
    st._on_timers()
    head = st.partition.channels[0].queue[0]
    assert type(head) is OutPriorityBarrier and head.barrier.unaligned
    with st.lock:
        st.partition.channels[0].queue.popleft()
        st.partition._barrier_sent(1)
    st.checkpoints.hand_over_ready()
    st.ack_worker.close()
    ack = coord.acks[1][("src", 0)]
    assert ack["metrics"]["unaligned"] is True
    persisted = ChannelStateReader(coord.blobs[ack["channel_state"]["blob_id"]]).segment_buffers(
        ack["channel_segments"][0]
    )
    assert persisted[: len(queued)] == queued and len(persisted) == len(queued) + 1
    records = [r for b in persisted for r in pickle_records(b)]
    assert [r[1] for r in records] == list(range(emitted(ack["source_offsets"])))


def timeout_barrier(trigger: int, timeout: int = 100) -> CheckpointBarrier:
    return CheckpointBarrier(1, trigger, "aligned_then_unaligned", alignment_timeout=timeout)


def persisted_input(coord: InMemoryCoordinator, vertex: str) -> list[bytes]:
    ack = coord.acks[1][(vertex, 0)]
    assert ack["metrics"]["unaligned"] is True
    (segment,) = ack["channel_segments"]
    assert segment["direction"] == "input"
    return ChannelStateReader(coord.blobs[ack["channel_state"]["blob_id"]]).segment_buffers(segment)


def test_a_received_aligned_barrier_still_queued_when_the_timeout_passes_overtakes_the_buffers_ahead_of_it():
    coord = InMemoryCoordinator()
    st = build("m", sink_pipeline(), coord)
    ch = st.gate.channels[0]
    first, second, after = encode_records(range(10, 20)), encode_records(range(20, 25)), encode_records([99])
    now = st.checkpoints.now_ms()
    with st.lock:
        for b in (first, second):
            ch.items.append(Buffer(b))
        st.gate._queue_barrier(ch, timeout_barrier(now, timeout=60_000))
        ch.items.append(Buffer(after))
    assert st.gate.next_deadline == now + 60_000
    st._on_timers()
    assert not st.gate.priority and type(ch.items[2]) is Barrier  # before the deadline: it waits its turn
    st.gate.next_deadline = now - 1  # the alignment timeout passed (as if 60 s went by)
    ch.items[2] = Barrier(timeout_barrier(now - 60_000, timeout=60_000))
    st._on_timers()
    assert type(ch.items[2]) is PriorityBarrier and st.gate.next_deadline is None
    st._handle_priority()  # the checkpoint is taken before the two queued buffers are processed
    assert st.records_in == 0
    while st._step():
        pass
    st.checkpoints.hand_over_ready()
    st.ack_worker.close()
    assert persisted_input(coord, "m") == [first, second]  # the exact bytes it overtook
    state = pickle.loads(coord.blobs[coord.acks[1][("m", 0)]["operator_state"]["blob_id"]])["operators"]["out"]
    assert state["records"] == []
    assert st.chain.operators[-1].sink.records == [*range(10, 25), 99]  # and everything is still processed once


def test_an_aligned_barrier_arriving_after_its_timeout_overtakes_at_once_unless_its_channel_is_blocked():
    coord = InMemoryCoordinator()
    st = build("m", sink_pipeline(), coord)
    ch = st.gate.channels[0]
    late = timeout_barrier(st.checkpoints.now_ms() - 1_000)
    with st.lock:
        ch.items.append(Buffer(encode_records([1, 2])))
        ch.blocked = True
        st.gate._queue_barrier(ch, late)
        assert type(ch.items[-1]) is Barrier and not st.gate.priority  # blocked: waits for the unblock
        assert st.gate.convert_due(st.checkpoints.now_ms()) == 0 and st.gate.next_deadline is not None
        ch.blocked = False
        assert st.gate.convert_due(st.checkpoints.now_ms()) == 1
        ch.items.clear()
        st.gate.priority.clear()
        ch.items.append(Buffer(encode_records([1, 2])))
        st.gate._queue_barrier(ch, late)
    assert type(ch.items[-1]) is PriorityBarrier and st.gate.priority[0][1].unaligned
    st._handle_priority()
    st.checkpoints.hand_over_ready()
    st.ack_worker.close()
    assert persisted_input(coord, "m") == [encode_records([1, 2])]


class CommitOnCompletion(CollectSink):
    """A committing sink that, like a database sink, cannot commit once closed."""

    commits_on_checkpoints = True

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[tuple[int, list]] = []
        self.buffer: list = []
        self.committed: list = []
        self.closed = False

    def write(self, record):
        self.buffer.append(record)

    def snapshot(self, checkpoint_id: int):
        if self.buffer:
            self.pending.append((checkpoint_id, self.buffer))
            self.buffer = []
        return {"pending": list(self.pending)}

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        assert not self.closed, "a commit after close loses the output"
        for cid, rows in [p for p in self.pending if p[0] <= checkpoint_id]:
            self.committed.extend(rows)
            self.pending.remove((cid, rows))

    def uncommitted(self) -> bool:
        return bool(self.buffer or self.pending)

    def close(self):
        self.closed = True
        return {"committed": list(self.committed), "pending": len(self.pending)}


def finished_sink_subtask():
    """A sink subtask whose input delivered records, the final (aligned) barrier 1 and its end: its loop ends
    with checkpoint 1 acknowledged but its completion not yet heard of."""
    coord = InMemoryCoordinator()
    p = Pipeline(f"settle-{next(_ids)}")
    p.source(SequenceSource(count=1), id="src").rebalance().map(lambda r: r, id="m").sink(CommitOnCompletion(), id="out")
    st = build("m", p, coord)
    ch = st.gate.channels[0]
    ch.items.extend([
        Buffer(encode_records([1, 2, 3])),
        Barrier(CheckpointBarrier(1, st.checkpoints.now_ms(), "aligned")),
        END,
    ])
    result = st.run()
    return st, result, st.chain.operators[-1].sink


_ids = iter(range(1_000_000))


def test_a_finished_sink_commits_the_final_checkpoint_whose_completion_comes_after_its_loop_ended():
    import threading

    st, result, sink = finished_sink_subtask()
    assert result.status == "finished" and sink.pending and not sink.committed
    late = threading.Timer(0.2, st.events.post, args=(CheckpointCompleted(checkpoint_id=1, attempt=None),))
    late.start()
    st.settle(result.status, timeout=30)
    st.close_operators(result)
    st.ack_worker.close()
    assert result.outputs["out"] == {"committed": [1, 2, 3], "pending": 0}


def test_a_finished_sink_whose_final_completion_never_comes_fails_instead_of_losing_output():
    import pytest

    from spark_plugin.task.subtask import SubtaskFailed

    st, result, sink = finished_sink_subtask()
    with pytest.raises(SubtaskFailed, match="completion did not arrive"):
        st.settle(result.status, timeout=0.3)
    st.ack_worker.close()
    assert sink.committed == [] and sink.pending  # still there for the restore to commit


def test_an_aligned_checkpoint_reports_the_bytes_processed_between_its_first_and_last_barrier():
    coord = InMemoryCoordinator()
    p = Pipeline("scripted-processed")
    p.source(SequenceSource(count=1), id="src", parallelism=2).rebalance().map(str, id="m", parallelism=1).sink(
        CollectSink(), id="out"
    )
    st = build("m", p, coord)
    first, second = st.gate.channels
    during = encode_records(range(10, 20))
    now = st.checkpoints.now_ms()
    barrier = CheckpointBarrier(1, now, "aligned")
    with st.lock:
        st.gate._queue_barrier(first, barrier)  # channel 0's barrier first: it blocks, channel 1 goes on
        second.items.append(Buffer(during))
        st.gate._queue_barrier(second, barrier)
    while st._step():
        pass
    st.checkpoints.hand_over_ready()
    st.ack_worker.close()
    metrics = coord.acks[1][("m", 0)]["metrics"]
    assert metrics["unaligned"] is False
    assert metrics["processed_data"] == len(during)  # what came through channel 1 while channel 0 was blocked
    assert metrics["persisted_data"] == 0


def test_the_last_buffer_of_a_replay_counts_as_recovery_until_it_is_processed():
    """Without checkpoints during recovery, a checkpoint may not start while the buffer in hand came before an
    upstream's RECOVERY_END (a regenerating upstream's replayed records are persisted by no one in that checkpoint),
    even once the gate's recovery is over."""
    coord = InMemoryCoordinator()
    st = build("m", sink_pipeline(), coord)
    st.checkpoints.during_recovery = False
    ch = st.gate.channels[0]
    ch.items.extend([Buffer(encode_records(range(10))), RECOVERY_END])
    st.gate.start_recovery()
    assert st._take_input()  # the replay's last buffer, taken while the gate recovers
    with st.lock:
        assert st.gate._recovery_phase() is None  # its upstream's RECOVERY_END is next: the gate's recovery is over
    assert not st.gate.recovering and st.checkpoints.recovering()
    st._process_current()
    assert st.current is None and not st.checkpoints.recovering()
