"""Channels over real TCP sockets: credit-based flow control, priority barriers, floating buffers."""

from __future__ import annotations

import socket
import threading
import time

from spark_plugin.network import wire
from spark_plugin.network.barrier import CheckpointBarrier
from spark_plugin.network.channel_items import Barrier, Buffer, End
from spark_plugin.network.framing import encode_records
from spark_plugin.network.input import InputGate
from spark_plugin.network.mailbox import Mailbox
from spark_plugin.network.output import OutputChannel
from spark_plugin.plan.topology import ChannelInfo


def _connect(n_channels: int = 1, exclusive: int = 2, floating: int = 0, max_out: int = 10):
    mb_out, mb_in = Mailbox(), Mailbox()
    sent: list[int] = []
    outs = [
        OutputChannel(i, ChannelInfo(f"out:a[0]->b[{i}]", "output"), max_out, mb_out, sent.append)
        for i in range(n_channels)
    ]
    gate = InputGate(
        [ChannelInfo(f"in:a[0]->b[{i}]", "input") for i in range(n_channels)], exclusive, floating, mb_in
    )
    for i in range(n_channels):
        a, b = socket.socketpair()
        outs[i].attach(a)
        gate.attach(i, b)
    return outs, gate, mb_out, mb_in, sent


def _wait_until(cond, mailbox: Mailbox, what: str):
    end = time.monotonic() + 10
    with mailbox.lock:
        while not cond():
            if time.monotonic() > end:
                raise AssertionError(f"timed out waiting for {what}")
            mailbox.wait(0.05)


def test_sender_sends_only_as_many_buffers_as_the_receiver_granted():
    outs, gate, mb_out, mb_in, _ = _connect(exclusive=2, floating=0)
    with mb_out.lock:
        for i in range(5):
            outs[0].add_buffer(encode_records([i]), 1)
    ch = gate.channels[0]
    _wait_until(lambda: len(ch.items) == 2, mb_in, "two buffers")
    time.sleep(0.2)  # give a misbehaving sender the chance to send a third
    with mb_in.lock:
        assert len(ch.items) == 2
    with mb_out.lock:
        assert outs[0].buffers == 3
        assert not outs[0].is_available()  # 3 queued, no credit left: more than the backlog of one
    # processing one buffer gives one credit back
    with mb_in.lock:
        gate.poll()
        gate.release(0)
    _wait_until(lambda: len(ch.items) == 2 and ch.received_buffers == 3, mb_in, "third buffer")


def test_output_is_unavailable_while_the_queue_holds_max_buffers():
    outs, gate, mb_out, mb_in, _ = _connect(exclusive=1, floating=0, max_out=3)
    with mb_out.lock:
        for i in range(4):
            outs[0].add_buffer(encode_records([i]), 1)
    _wait_until(lambda: gate.channels[0].received_buffers == 1, mb_in, "first buffer")
    with mb_out.lock:
        assert outs[0].buffers == 3
        assert not outs[0].is_available()


def test_priority_barrier_needs_no_credit_and_overtakes_queued_buffers():
    outs, gate, mb_out, mb_in, sent = _connect(exclusive=1, floating=0)
    with mb_out.lock:
        for i in range(4):
            outs[0].add_buffer(encode_records([i]), 1)
    ch = gate.channels[0]
    _wait_until(lambda: ch.received_buffers == 1, mb_in, "first buffer")
    barrier = CheckpointBarrier(7, 0, "unaligned", unaligned=True)
    with mb_out.lock:
        overtaken = outs[0].add_priority_barrier(barrier)
    assert [b.data for b in overtaken] == [encode_records([i]) for i in (1, 2, 3)]
    outs[0].send_priority()  # the calling thread writes it: the sender thread waits for credit meanwhile
    _wait_until(lambda: len(gate.priority) == 1, mb_in, "priority barrier")
    with mb_in.lock:
        index, got = gate.next_priority()
        assert (index, got.checkpoint_id) == (0, 7)
        assert ch.buffers_before(7) == [encode_records([0])]  # it overtook the received, unprocessed buffer too
        gate.priority_done(index, got)
        assert [type(item) for item in ch.items] == [Buffer] and not gate.priority
    _wait_until(lambda: sent == [7], mb_out, "the sender to report the barrier sent")


def test_a_priority_barrier_goes_out_on_the_sender_thread_when_it_is_writing():
    outs, gate, mb_out, mb_in, sent = _connect(exclusive=1, floating=0)
    with mb_out.lock:
        outs[0].add_buffer(encode_records([0]), 1)
        outs[0].add_buffer(encode_records([1]), 1)
    _wait_until(lambda: gate.channels[0].received_buffers == 1, mb_in, "first buffer")
    # the sender thread is writing a message: the loop leaves the barrier to it. The lock is taken before the
    # barrier is queued: the sender thread, out of credit, may not have gone back to waiting yet, and would send a
    # barrier it finds at the head of the queue on its own
    with outs[0]._send_lock:
        with mb_out.lock:
            outs[0].add_priority_barrier(CheckpointBarrier(9, 0, "unaligned", unaligned=True))
        outs[0].send_priority()
        time.sleep(0.05)
        assert sent == []
    _wait_until(lambda: sent == [9], mb_out, "the sender thread to send the barrier")
    _wait_until(lambda: len(gate.priority) == 1, mb_in, "priority barrier")


def test_a_barrier_sent_from_the_loop_keeps_the_wire_in_queue_order():
    """While the sender thread streams buffers with plenty of credit, a priority barrier written by the calling
    thread goes out after exactly the buffers it did not overtake; every buffer goes out once, in order."""
    for round_ in range(10):
        mb = Mailbox()
        out = OutputChannel(0, ChannelInfo("out:a[0]->b[0]", "output"), 64, mb, lambda cid: None)
        a, b = socket.socketpair()
        frames: list[tuple[int, bytes]] = []

        def receive(sock=b, frames=frames):
            wire.send(sock, wire.CREDIT, 1000)
            while True:
                kind, _, payload = wire.recv(sock)
                frames.append((kind, payload))
                if kind == wire.END:
                    return

        receiver = threading.Thread(target=receive, daemon=True)
        receiver.start()
        out.attach(a)
        added = [encode_records([round_, i]) for i in range(60)]
        overtaken: list[bytes] = []
        for i, data in enumerate(added):
            with mb.lock:
                out.add_buffer(data, 1)
            time.sleep(0.0002 * (round_ % 4))  # the sender thread is somewhere in taking and writing a buffer
            if i == 40:
                with mb.lock:
                    overtaken = [b.data for b in out.add_priority_barrier(
                        CheckpointBarrier(round_ + 1, 0, "unaligned", unaligned=True))]
                out.send_priority()
        with mb.lock:
            out.end()
        receiver.join(10)
        assert not receiver.is_alive(), "the receiver did not get the end of the channel"
        kinds = [k for k, _ in frames]
        assert kinds.count(wire.PRIORITY) == 1
        buffers = [p for k, p in frames if k == wire.BUFFER]
        assert buffers == added
        ahead = kinds.index(wire.PRIORITY)
        assert buffers[:ahead] == added[:41 - len(overtaken)]
        out.close()
        wire.close(b)


def test_a_buffer_taken_off_the_queue_goes_out_before_a_barrier_the_loop_sends():
    """The sender thread took buffer 0 off the queue (so the barrier does not overtake it) and has not written it
    yet: the loop's direct send must not put the barrier ahead of it on the wire."""
    mb = Mailbox()
    out = OutputChannel(0, ChannelInfo("out:a[0]->b[0]", "output"), 64, mb, lambda cid: None)
    a, b = socket.socketpair()
    popped, go = threading.Event(), threading.Event()
    take = out._pop

    def slow_pop():
        item = take()
        if item is not None and not popped.is_set():
            popped.set()
            go.wait(5)
        return item

    out._pop = slow_pop
    out.attach(a)
    with mb.lock:
        for i in range(3):
            out.add_buffer(encode_records([i]), 1)
    wire.send(b, wire.CREDIT, 1)
    assert popped.wait(5), "the sender thread did not take the first buffer"
    with mb.lock:
        overtaken = [b.data for b in out.add_priority_barrier(CheckpointBarrier(4, 0, "unaligned", unaligned=True))]
    assert overtaken == [encode_records([1]), encode_records([2])]
    out.send_priority()
    go.set()
    b.settimeout(5)
    first, second = wire.recv(b), wire.recv(b)
    assert (first[0], first[2]) == (wire.BUFFER, encode_records([0]))
    assert second[0] == wire.PRIORITY and CheckpointBarrier.decode(second[2]).checkpoint_id == 4
    out.close()
    wire.close(b)


def test_aligned_barrier_waits_behind_queued_buffers():
    outs, gate, mb_out, mb_in, sent = _connect(exclusive=1, floating=0)
    with mb_out.lock:
        outs[0].add_buffer(encode_records([0]), 1)
        outs[0].add_buffer(encode_records([1]), 1)
        outs[0].add_barrier(CheckpointBarrier(3, 0))
    ch = gate.channels[0]
    _wait_until(lambda: ch.received_buffers == 1, mb_in, "first buffer")
    time.sleep(0.1)
    assert sent == []
    with mb_in.lock:
        gate.poll()
        gate.release(0)
    _wait_until(lambda: len(ch.items) == 2, mb_in, "buffer and barrier")
    with mb_in.lock:
        assert [type(item) for item in ch.items] == [Buffer, Barrier]
    _wait_until(lambda: sent == [3], mb_out, "the sender to report the barrier sent")


def test_stuck_aligned_barrier_is_converted_to_a_priority_barrier():
    outs, gate, mb_out, mb_in, sent = _connect(exclusive=1, floating=0)
    with mb_out.lock:
        for i in range(3):
            outs[0].add_buffer(encode_records([i]), 1)
        outs[0].add_barrier(CheckpointBarrier(5, 0, "aligned_then_unaligned", 10))
    _wait_until(lambda: gate.channels[0].received_buffers == 1, mb_in, "first buffer")
    with mb_out.lock:
        overtaken = outs[0].convert_barrier(5)
        assert outs[0].convert_barrier(5) is None
    assert [b.data for b in overtaken] == [encode_records([1]), encode_records([2])]
    outs[0].send_priority()
    _wait_until(lambda: len(gate.priority) == 1, mb_in, "converted barrier")
    with mb_in.lock:
        _, barrier = gate.next_priority()
    assert barrier.unaligned and barrier.checkpoint_id == 5


def test_floating_buffers_go_to_the_channel_with_a_backlog():
    outs, gate, mb_out, mb_in, _ = _connect(n_channels=2, exclusive=1, floating=3)
    with mb_out.lock:
        for i in range(6):
            outs[0].add_buffer(encode_records([i]), 1)
    ch0, ch1 = gate.channels
    _wait_until(lambda: ch0.received_buffers == 4, mb_in, "exclusive plus floating buffers")
    time.sleep(0.1)
    with mb_in.lock:
        assert ch0.received_buffers == 4 and ch0.floating == 3 and ch1.floating == 0
        # processing returns floating buffers once the backlog is covered
        for _ in range(4):
            gate.poll()
            gate.release(0)
    _wait_until(lambda: ch0.received_buffers == 6, mb_in, "the rest")


def test_end_of_partition_is_queued_after_the_data():
    outs, gate, mb_out, mb_in, _ = _connect(exclusive=2)
    with mb_out.lock:
        outs[0].add_buffer(encode_records([1]), 1)
        outs[0].end()
    ch = gate.channels[0]
    _wait_until(lambda: len(ch.items) == 2, mb_in, "buffer and end")
    with mb_in.lock:
        assert [type(item) for item in ch.items] == [Buffer, End]
    assert gate.failed() is None


def _partition(writer):
    from spark_plugin.network.config import NetworkConfig
    from spark_plugin.network.partition import OutputPartition
    from spark_plugin.plan.job import JobEdge
    from spark_plugin.plan.topology import OutputEdgeSpec

    info = ChannelInfo("a[0]->b[0]", "output", "b", 0, "forward")
    edge = OutputEdgeSpec(JobEdge("a", "b", "forward"), 1, 128, [info], ["b[0]"])
    mb = Mailbox()
    return OutputPartition([edge], [None], NetworkConfig(), mb, writer), mb


def test_the_output_side_of_a_priority_barrier_ends_as_it_is_queued_an_aligned_one_once_sent():
    """A priority barrier's output channel state is complete once it is at the head of every queue (what it
    overtook is recorded then), even before the channel could send it; an aligned barrier's only once sent."""
    from spark_plugin.task.channel_state import ChannelStateWriter

    writer = ChannelStateWriter()
    partition, mb = _partition(writer)  # no receiver connected: nothing can be sent
    for cid in (1, 2):
        writer.start(cid)
        writer.finish_input(cid)
    with mb.lock:
        partition.channels[0].add_buffer(encode_records([1]), 1)
    partition.broadcast_barrier(CheckpointBarrier(1, 0, "unaligned", unaligned=True), priority=True)
    assert writer.done(1)
    assert writer.take(1).persisted_bytes == len(encode_records([1]))
    partition.broadcast_barrier(CheckpointBarrier(2, 0), priority=False)
    assert not writer.done(2) and partition.barriers_queued(2)
    a, b = socket.socketpair()
    partition.channels[0].attach(a)
    wire.send(b, wire.CREDIT, 10)
    _wait_until(lambda: writer.done(2), mb, "the aligned barrier to be sent")
    partition.close()
    wire.close(b)
