"""Channels over real TCP sockets: credit-based flow control, priority barriers, floating buffers."""

from __future__ import annotations

import socket
import time

from spark_plugin.network import input as net_input
from spark_plugin.network.barrier import CheckpointBarrier
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
    assert [d for d, _ in overtaken] == [encode_records([i]) for i in (1, 2, 3)]
    _wait_until(lambda: len(gate.priority) == 1, mb_in, "priority barrier")
    with mb_in.lock:
        index, got = gate.next_priority()
        assert (index, got.checkpoint_id) == (0, 7)
        assert ch.buffers_before(7) == [encode_records([0])]  # it overtook the received, unprocessed buffer too
        gate.priority_done(index, got)
        assert [item[0] for item in ch.items] == [net_input.BUFFER] and not gate.priority
    _wait_until(lambda: sent == [7], mb_out, "the sender to report the barrier sent")


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
        assert [item[0] for item in ch.items] == [net_input.BUFFER, net_input.BARRIER]
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
    assert [d for d, _ in overtaken] == [encode_records([1]), encode_records([2])]
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
        assert [item[0] for item in ch.items] == [net_input.BUFFER, net_input.END]
    assert gate.failed() is None
