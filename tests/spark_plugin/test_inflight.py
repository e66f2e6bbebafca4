"""No more in flight than needed: an output channel holds at most its credit plus one buffer of backlog, floating
buffers follow announced backlog, unaligned checkpoints persist no more than the sizing allows, and buffer
debloating (FLIP-183) sizes buffers to a target time of throughput without costing exactly-once."""

from __future__ import annotations

import json
import socket
import time

import pytest

from spark_plugin import Pipeline
from spark_plugin.connectors import CollectSink, FileSink, SequenceSource
from spark_plugin.network import wire
from spark_plugin.network.config import BACKLOG, NetworkConfig
from spark_plugin.network.debloat import BufferDebloater
from spark_plugin.network.framing import encode_records
from spark_plugin.network.input import InputGate
from spark_plugin.network.mailbox import Mailbox
from spark_plugin.network.output import OutputChannel
from spark_plugin.network.record_writer import RecordWriter
from spark_plugin.plan.topology import ChannelInfo
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.fakes import InMemoryCoordinator
from tests.spark_plugin.test_restore_threads import plan_from_acks
from tests.spark_plugin.test_subtask_threads import backpressured, wait_for

OUT = ChannelInfo("out:a[0]->b[0]", "output")
IN = ChannelInfo("in:a[0]->b[0]", "input")


def _pair(exclusive: int = 2, floating: int = 0, max_out: int = 10):
    mb_out, mb_in = Mailbox(), Mailbox()
    out = OutputChannel(0, OUT, max_out, mb_out, lambda cid: None)
    gate = InputGate([IN], exclusive, floating, mb_in)
    a, b = socket.socketpair()
    out.attach(a)
    gate.attach(0, b)
    return out, gate, mb_out, mb_in


def _until(cond, lock, what: str) -> None:
    """Poll ``cond`` under ``lock`` (without consuming a mailbox signal) until it holds."""
    end = time.monotonic() + 10
    while True:
        with lock:
            if cond():
                return
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def _produce(out: OutputChannel, mb: Mailbox, seen: list[int]) -> int:
    """What the subtask loop does: add buffers while the channel is available; returns how many were added."""
    n = 0
    with mb.lock:
        while out.is_available():
            out.add_buffer(encode_records([n]), 1)
            n += 1
            seen.append(out.buffers - out.credit)
    return n


# ------------------------------------------------------------------------------------------- credit + backlog


def test_an_output_channel_never_holds_more_than_its_credit_plus_the_backlog():
    out, gate, mb_out, mb_in = _pair(exclusive=2, floating=0, max_out=10)
    over: list[int] = []  # queued minus credit, after every buffer the producer added
    _until(lambda: out.credit == 2, mb_out.lock, "the exclusive credits")
    _produce(out, mb_out, over)
    ch = gate.channels[0]
    _until(lambda: ch.received_buffers == 2 and out.credit == 0, mb_in.lock, "two buffers at the receiver")
    _produce(out, mb_out, over)
    with mb_out.lock:
        assert out.buffers == BACKLOG and not out.is_available()  # not max_out (10): the receiver is full
    for _ in range(5):  # a slow consumer: one buffer at a time
        with mb_in.lock:
            gate.poll()
            gate.release(0)
        received = ch.received_buffers
        _until(lambda r=received: ch.received_buffers == r + 1, mb_in.lock, "the next buffer")
        _until(lambda: out.is_available(), mb_out.lock, "room for the next buffer")
        _produce(out, mb_out, over)
    assert over and max(over) <= BACKLOG


def test_the_backlog_is_configurable_and_without_a_bound_only_max_buffers_limits_a_channel():
    def fill(backlog, credit):
        mb = Mailbox()
        ch = OutputChannel(0, OUT, 10, mb, lambda cid: None, backlog)  # no receiver: credit stays as set here
        ch.credit = credit
        n = 0
        with mb.lock:
            while ch.is_available() and n < 100:
                ch.add_buffer(encode_records([n]), 1)
                n += 1
        return n

    assert fill(BACKLOG, 0) == BACKLOG and fill(BACKLOG, 2) == 2 + BACKLOG
    assert fill(3, 2) == 5 and fill(3, 9) == 10  # never past max_buffers
    assert fill(None, 0) == 10 and fill(None, 2) == 10
    assert NetworkConfig().output_backlog_buffers == BACKLOG
    assert NetworkConfig(output_backlog_buffers=None).output_buffers_bound() == 10
    assert NetworkConfig(output_backlog_buffers=0).output_buffers_bound() == 2 + 8
    with pytest.raises(ValueError, match="output_backlog_buffers -1 must not be negative"):
        NetworkConfig(output_backlog_buffers=-1)


def test_a_credit_arriving_wakes_the_subtask_loop_to_flush_what_it_holds():
    out, gate, mb_out, mb_in = _pair(exclusive=1)
    _until(lambda: out.credit == 1, mb_out.lock, "the exclusive credit")
    with mb_out.lock:
        out.add_buffer(encode_records([0]), 1)
    _until(lambda: gate.channels[0].received_buffers == 1, mb_in.lock, "the first buffer")
    _until(lambda: out.buffers == 0 and out.credit == 0, mb_out.lock, "the buffer sent")
    with mb_out.lock:
        assert not out.can_send()  # a partly filled buffer would stay with the record writer now
        mb_out.pending = False
    with mb_in.lock:
        gate.poll()
        gate.release(0)
    _until(lambda: out.credit == 1, mb_out.lock, "the credit")
    with mb_out.lock:
        assert out.can_send()
        assert mb_out.pending, "the credit did not signal the loop's mailbox"


def test_a_partly_filled_buffer_is_flushed_on_the_interval_only_when_its_channel_would_send_it():
    mb = Mailbox()
    ch = OutputChannel(0, OUT, 10, mb, lambda cid: None)  # no receiver: credit stays as set here
    writer = RecordWriter([ch], "forward", None, 128, 4096, mb)
    writer.emit((1, 1))
    writer.flush_sendable()
    assert ch.buffers == 0 and writer.builders[0].records == 1  # no credit: it keeps filling
    ch.credit = 1
    writer.flush_sendable()
    assert ch.buffers == 1 and writer.builders[0].records == 0
    writer.emit((1, 2))
    writer.flush_sendable()
    assert ch.buffers == 1  # credit 1, one queued: a second would wait
    writer.flush_all()  # before a barrier and at the end, everything goes
    assert ch.buffers == 2


def test_floating_buffers_are_lent_only_for_an_announced_backlog():
    mb = Mailbox()
    gate = InputGate([IN], 1, 4, mb)
    sender, receiver = socket.socketpair()
    gate.attach(0, receiver)
    assert wire.recv(sender)[:2] == (wire.CREDIT, 1)
    ch = gate.channels[0]
    wire.send(sender, wire.BUFFER, 0, encode_records([0]))  # backlog 0
    _until(lambda: ch.received_buffers == 1, mb.lock, "the first buffer")
    with mb.lock:
        assert ch.floating == 0 and gate.floating_free == 4
        gate.poll()
        gate.release(0)
    assert wire.recv(sender)[:2] == (wire.CREDIT, 1)
    wire.send(sender, wire.BUFFER, 3, encode_records([1]))  # three more wait at the sender
    _until(lambda: ch.received_buffers == 2, mb.lock, "the second buffer")
    with mb.lock:
        assert ch.floating == 3 and gate.floating_free == 1
    assert wire.recv(sender)[:2] == (wire.CREDIT, 3)
    gate.close()
    sender.close()


def _source_to_slow(count: int | None = None, parallelism: int = 1) -> Pipeline:
    def slow(key, record, state):
        time.sleep(0.0005)
        return [record]

    p = Pipeline("inflight", parallelism=parallelism)
    (
        p.source(SequenceSource(count=count, keys=16), id="src")
        .key_by(lambda r: r[0])
        .process(slow, id="slow")
        .sink(CollectSink(), id="out")
    )
    return p


def _persisted(coord: InMemoryCoordinator, cid: int) -> int:
    return sum(
        len(coord.blobs[a["channel_state"]["blob_id"]])
        for a in coord.acks[cid].values()
        if a.get("channel_state")
    )


def test_unaligned_checkpoints_under_backpressure_persist_no_more_than_the_sizing_allows():
    # no floating buffers and room for 10 per output channel: the old bound was the receiver's 2 plus 10 queued
    net = NetworkConfig(buffer_size=4096, exclusive_buffers_per_channel=2, floating_buffers_per_gate=0,
                        max_buffers_per_output_channel=10)
    bound = net.inflight_capacity_bytes(inputs=0, outputs=1) + net.inflight_capacity_bytes(inputs=1, outputs=0)
    bound += 64 * (net.output_buffers_bound() + 1 + net.exclusive_buffers_per_channel)  # a record past each cut
    coord = InMemoryCoordinator()
    run = ThreadedRun(_source_to_slow(), coord.reporter, coord.events, net, deadline=time.time() + 120).start()
    slow = run.subtask("slow", 0)
    persisted = []
    for cid in range(1, 5):
        wait_for(lambda cid=cid: slow.records_in > 500 * cid, "records to flow")
        coord.trigger(cid, "unaligned")
        wait_for(lambda cid=cid: len(coord.acks.get(cid, {})) == 2, f"checkpoint {cid}")
        persisted.append(_persisted(coord, cid))
    from contract.events import JobStatusChanged

    coord.publish(JobStatusChanged(status="CANCELLED"))
    run.join(60)
    assert any(persisted), "no checkpoint persisted in-flight data: the pipeline was not backpressured"
    assert max(persisted) <= bound, f"persisted {persisted} bytes, more than the sizing allows ({bound})"
    assert bound < (net.max_buffers_per_output_channel + 2) * net.buffer_size


# --------------------------------------------------------------------------------------------- debloating


def _debloater(**over) -> BufferDebloater:
    config = dict(buffer_size=32 * 1024, debloat_target_s=1.0, debloat_period_s=0.2, debloat_samples=1,
                  debloat_threshold_percent=25, debloat_min_buffer_size=256)
    config.update(over)
    return BufferDebloater(NetworkConfig(**config), now=0.0)


def _period(d: BufferDebloater, now: float, nbytes: int, in_use: int, idle: float = 0.0) -> int | None:
    d.add_bytes(nbytes)
    d.add_idle(idle)
    return d.recalculate(now, in_use)


def test_the_buffer_size_is_the_target_time_of_throughput_over_the_buffers_in_use():
    d = _debloater()
    # 10 KiB in 0.2 s = 50 KiB/s; 1 s of it over 4 buffers
    assert _period(d, 0.2, 10 * 1024, 4) == 50 * 1024 // 4
    assert d.throughput == pytest.approx(50 * 1024)


def test_idle_time_does_not_count_as_time_to_take_input():
    d = _debloater()
    # half of the period waited for input: the subtask took 10 KiB in 0.1 s
    assert _period(d, 0.2, 10 * 1024, 8, idle=0.1) == 100 * 1024 // 8
    assert _period(d, 0.4, 0, 8, idle=0.2) is None  # idle all along: nothing learnt, the size stays


def test_the_size_converges_down_under_a_slow_consumer_and_back_up_when_it_speeds_up():
    d = _debloater(debloat_samples=20)
    sizes = [32 * 1024]
    now = 0.0
    for _ in range(200):  # 2,000 B/s, 4 buffers: 500 B each
        now += 0.2
        new = _period(d, now, 400, 4)
        if new is not None:
            assert new < sizes[-1]
            sizes.append(new)
    assert d.size == pytest.approx(500, abs=5)  # 1 s of 2,000 B/s over 4 buffers
    assert 500 <= sizes[-1] <= 500 / 0.75  # announced: within the threshold of that
    for _ in range(200):  # 1 MiB/s: more than 32 KiB per buffer, so back to the configured size
        now += 0.2
        new = _period(d, now, 200 * 1024, 4)
        if new is not None:
            assert new > sizes[-1]
            sizes.append(new)
    assert sizes[-1] == 32 * 1024


def test_a_size_is_announced_only_when_it_changed_by_more_than_the_threshold_and_stays_within_bounds():
    d = _debloater(debloat_threshold_percent=25)
    assert _period(d, 0.2, 6 * 1024, 1) is None  # 30 KiB: within 25 % of 32 KiB
    assert _period(d, 0.4, 4 * 1024, 1) == 20 * 1024
    assert _period(d, 0.6, 4 * 1024 + 800, 1) is None  # 23.9 KiB: within 25 % of 20 KiB
    assert _period(d, 0.8, 10, 1) == 256  # the minimum is announced whatever the threshold
    assert _period(d, 1.0, 10 * 1024 * 1024, 1) == 512  # grows at most twofold per period


def test_senders_cut_buffers_at_the_announced_size():
    mb = Mailbox()
    ch = OutputChannel(0, OUT, 1000, mb, lambda cid: None)
    ch.credit = 1000
    writer = RecordWriter([ch], "forward", None, 128, 4096, mb)
    record = (1, "x" * 50)
    one = len(encode_records([record]))
    with mb.lock:
        ch.on_buffer_size(300)  # what the credit thread does on a BUFFER_SIZE message
    for _ in range(60):
        writer.emit(record)
    sizes = [len(item.data) for item in ch.queue]
    assert sizes and all(300 <= s < 300 + one for s in sizes)
    with mb.lock:
        ch.on_buffer_size(1 << 20)  # never above the configured size
    for _ in range(200):
        writer.emit(record)
    assert max(len(item.data) for item in ch.queue) < 4096 + one


def test_a_slow_consumer_announces_smaller_buffers_and_its_senders_cut_them():
    net = NetworkConfig(buffer_size=8192, debloat_target_s=0.05, debloat_period_s=0.02, debloat_samples=1,
                        debloat_min_buffer_size=256)
    coord = InMemoryCoordinator()
    run = ThreadedRun(_source_to_slow(), coord.reporter, coord.events, net, deadline=time.time() + 120).start()
    src, slow = run.subtask("src", 0), run.subtask("slow", 0)
    out = src.partition.channels[0]
    wait_for(lambda: out.buffer_size is not None and out.buffer_size < 4096, "a smaller announced size")
    with src.lock:  # the sender cuts at what it was told last, which the receiver announced
        assert src.partition.writers[0].builders[0].capacity == out.buffer_size
        assert net.debloat_min_buffer_size <= out.buffer_size < net.buffer_size
    assert slow.gate.debloater.announced < net.buffer_size  # the receiver of that channel chose it
    from contract.events import JobStatusChanged

    coord.publish(JobStatusChanged(status="CANCELLED"))
    run.join(60)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("debloat_target_s", 0, "debloat_target_s 0 must be a positive number of seconds"),
        ("debloat_target_s", -1.0, "debloat_target_s -1.0 must be a positive number of seconds"),
        ("debloat_period_s", 0, "debloat_period_s 0 must be a positive number of seconds"),
        ("debloat_min_buffer_size", 32, "debloat_min_buffer_size 32 is too small; use at least 64 bytes"),
        ("debloat_min_buffer_size", 64 * 1024, "debloat_min_buffer_size 65536 is larger than buffer_size 32768"),
        ("debloat_threshold_percent", 100, "debloat_threshold_percent 100 must be from 0 to 99"),
        ("debloat_threshold_percent", -1, "debloat_threshold_percent -1 must be from 0 to 99"),
        ("debloat_samples", 0, "debloat_samples 0 must be at least 1"),
    ],
)
def test_bad_debloating_options_are_rejected_saying_what_is_allowed(option, value, message):
    with pytest.raises(ValueError, match=message):
        NetworkConfig(**{"debloat_target_s": 1.0, option: value})


@pytest.mark.parametrize("value", [float("nan"), -0.5, float("inf")])
def test_a_flush_interval_that_is_not_a_finite_number_of_seconds_is_rejected(value):
    # NaN made the loop's next wake-up NaN and a negative one made it spin; neither flushed on time
    with pytest.raises(ValueError, match=f"flush_interval {value!r} must be a finite number of seconds, at least 0"):
        NetworkConfig(flush_interval=value)


def test_debloating_is_off_by_default_and_reachable_from_the_public_network_config():
    import spark_plugin

    assert NetworkConfig().debloat_target_s is None and not NetworkConfig().debloating
    assert spark_plugin.NetworkConfig(debloat_target_s=1.0).debloating


# ---------------------------------------------------------------------------------- exactly once, debloated

DEBLOATED = NetworkConfig(buffer_size=2048, debloat_target_s=0.02, debloat_period_s=0.02, debloat_samples=2,
                          debloat_min_buffer_size=128)


def test_a_debloated_run_stopped_after_an_unaligned_checkpoint_restores_every_record_exactly_once_in_order():
    count = 20_000
    coord = InMemoryCoordinator()
    first = ThreadedRun(backpressured(count), coord.reporter, coord.events, DEBLOATED).start()
    slow = first.subtask("slow", 0)
    wait_for(lambda: slow.gate.debloater.announced < DEBLOATED.buffer_size and slow.records_in > 600,
             "smaller buffers announced")
    coord.trigger(1, "unaligned")
    wait_for(lambda: len(coord.acks.get(1, {})) == 4, "checkpoint 1")
    from contract.events import JobStatusChanged

    coord.publish(JobStatusChanged(status="CANCELLED"))  # stop mid-stream, as a failure would
    first.join(60)
    plan = plan_from_acks(coord.acks[1])
    assert any(p["input_channel_state"] or p["output_channel_state"] for p in plan.values())

    def fetch(blob_id, start, end):
        data = coord.blobs[blob_id]
        return data if start is None else data[start : end + 1]

    second_coord = InMemoryCoordinator()
    second = ThreadedRun(backpressured(count), second_coord.reporter, second_coord.events, DEBLOATED,
                         restore=plan, fetch=fetch, restore_checkpoint=1).start()
    results = second.join(120)
    records = [r for res in results for out in res.outputs.values() if "records" in out for r in out["records"]]
    assert sorted(r[1] for r in records) == list(range(count))
    by_stream: dict[tuple, list[int]] = {}
    for key, seq in records:
        by_stream.setdefault((key, seq % 2), []).append(seq)
    assert all(v == sorted(v) for v in by_stream.values()), "records of a key were reordered"


@pytest.mark.spark
@pytest.mark.slow
def test_killed_subtasks_of_a_debloated_pipeline_leave_file_output_exactly_once(spark, coordinator, tmp_path):
    from contract.models import CheckpointConfig
    from spark_plugin.driver.restart import FixedDelay
    from spark_plugin.driver.supervisor import Supervisor
    from tests.recovery.pipelines import WorkerKiller, check_exactly_once, keyed_counter

    kills, count = 2, 20_000
    pid_dir, out = tmp_path / "pids", tmp_path / "out"
    pid_dir.mkdir()
    network = NetworkConfig(buffer_size=1024, debloat_target_s=0.05, debloat_period_s=0.05)
    pipeline = keyed_counter("kill-debloated", count, FileSink(str(out)), pid_dir, held=True)
    config = CheckpointConfig(interval=400, policy="unaligned", timeout=30_000, retained=3)
    with WorkerKiller(pid_dir, 4, kills, seed=31) as killer:
        result = Supervisor(pipeline, FixedDelay(max_restarts=kills + 3, delay=0.2)).run(
            spark, coordinator.url, checkpoint=config, network=network
        )
    assert result.status == "finished"
    assert len(killer.killed) == kills
    assert any(r.restored is not None for r in result.restarts), "no restart restored a checkpoint"
    rows = [tuple(json.loads(line)) for f in sorted(out.glob("part-*.jsonl")) for line in f.read_text().splitlines()]
    check_exactly_once(rows, count)
