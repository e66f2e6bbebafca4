"""Regenerated outputs, piece by piece: the last-barrier states of a regenerating subtask and of its consumer, the
producer's log of inputs (what it keeps, and for how long) and the consumer's counts (what a regenerated record it
drops). The whole, over sockets with restores and rescales, is in ``test_regeneration_threads.py``."""

from __future__ import annotations

import pickle

from contract.keygroups import key_group
from spark_plugin import Pipeline
from spark_plugin.api.chaining import regenerates
from spark_plugin.connectors import CollectSink, SequenceSource
from spark_plugin.network.barrier import CheckpointBarrier
from spark_plugin.network.elements import Regenerated
from spark_plugin.network.mailbox import Mailbox
from spark_plugin.network.output import OutputChannel
from spark_plugin.network.record_writer import RecordWriter
from spark_plugin.plan.topology import ChannelInfo
from spark_plugin.task.barriers import BarrierHandler
from spark_plugin.task.regeneration import InputCounts, OutputLog, logged_inputs
from tests.spark_plugin.fakes import RecordingActions

POLICY = "unaligned_last_barrier"
MAXP = 8


def priority(cid: int) -> CheckpointBarrier:
    return CheckpointBarrier(cid, trigger_timestamp=1_000, policy=POLICY, unaligned=True)


# ------------------------------------------------------------------------------------------------ barrier states


def test_a_consumer_persists_nothing_of_a_regenerating_channel_and_the_rest_as_before():
    actions = RecordingActions(2)
    actions.regenerated = frozenset({0})
    h = BarrierHandler(actions)
    h.on_barrier(0, priority(1))
    h.on_barrier(1, priority(1))
    assert actions.take() == [
        ("block_overtaken", 0, 1),  # blocked at its barrier all the same: nothing after it counts before the snapshot
        ("snapshot", 1, True),
        ("record", 1, 1),
        ("stop_record", 1),
        ("forward", 1, False),
        ("unblock_all",),
        ("finish_input", 1),
    ]


def test_a_regenerating_subtask_forwards_its_last_barrier_with_priority():
    actions = RecordingActions(2)
    actions.regenerating = True
    h = BarrierHandler(actions)
    h.on_barrier(0, priority(1))
    h.on_barrier(1, priority(1))
    calls = actions.take()
    assert ("forward", 1, True) in calls and ("forward", 1, False) not in calls
    assert calls.index(("snapshot", 1, True)) < calls.index(("forward", 1, True))


# ------------------------------------------------------------------------------------------------ the plan


def _plan(deterministic: bool, then_key_by: bool = True, source_chained: bool = False):
    p = Pipeline("p", parallelism=2)
    s = p.source(SequenceSource(count=10, keys=4), id="src")
    if not source_chained:
        s = s.rebalance()
    s = s.flat_map(lambda r: [r], id="flat", deterministic=deterministic)
    if then_key_by:
        s.key_by(lambda r: r[0]).process(lambda k, r, st: [r], id="slow").sink(CollectSink(), id="out")
    else:
        s.rebalance().map(lambda r: r, id="slow").sink(CollectSink(), id="out")
    return p.plan()


def test_only_a_deterministic_stateless_vertex_fed_over_the_network_with_one_key_by_output_regenerates():
    assert regenerates(_plan(True).vertex("flat"))
    assert _plan(True).vertex("flat").outputs[0].regenerated
    assert not regenerates(_plan(False).vertex("flat"))
    assert not regenerates(_plan(True, then_key_by=False).vertex("flat"))  # a rebalance edge: no key groups
    plan = _plan(True, source_chained=True)
    assert not any(regenerates(v) for v in plan.vertices)  # chained with its source: nothing to log


# ------------------------------------------------------------------------------------------------ the producer's log


class _Channels:
    """Two output channels of one hash edge whose queues the test drains by hand."""

    def __init__(self) -> None:
        self.mailbox = Mailbox()
        self.channels = [
            OutputChannel(i, ChannelInfo(f"out:{i}", "output", "down", i, "hash"), 100, self.mailbox, lambda c: None)
            for i in range(2)
        ]
        self.writer = RecordWriter(self.channels, "hash", lambda r: r[0], MAXP, 64, self.mailbox)

    def send(self, channel: int, buffers: int) -> None:
        """The sender thread takes ``buffers`` queued buffers of ``channel``."""
        ch = self.channels[channel]
        for _ in range(buffers):
            ch.queue.popleft()
            ch.buffers -= 1


def _key_on(channel: int) -> int:
    """A key whose key group goes to ``channel`` of two."""
    return next(k for k in range(100) if key_group(k, MAXP) * 2 // MAXP == channel)


def _outputs(c: _Channels, key: int):
    """A flat_map whose input ``(name, n)`` makes ``n`` outputs of ``key``."""
    return lambda r: [c.writer.emit((key, r[0], j)) for j in range(r[1])]


def test_the_log_keeps_an_input_until_its_last_buffer_is_sent_and_past_what_the_consumer_may_hold():
    c = _Channels()
    log = OutputLog(c.writer, unprocessed_per_channel=2, subtask_index=0)
    process = log.wrap(_outputs(c, _key_on(0)))
    kept = lambda: (log.trim(), [r[0] for r in log.records])[1]  # noqa: E731 (the loop trims every 32 inputs)
    process(("a", 20))  # several buffers, its last outputs in the one still filling
    c.send(0, c.channels[0].buffers)
    process(("b", 0))
    assert kept() == ["a", "b"]  # its last buffer is not even finished
    c.writer.flush_all()
    c.send(0, c.channels[0].buffers)
    process(("c", 0))
    assert kept()[0] == "a"  # sent, but among the last 2 sent: the consumer may not have processed it
    process(("d", 6))  # two more buffers
    c.writer.flush_all()
    c.send(0, c.channels[0].buffers)
    process(("e", 0))
    assert kept() == ["d", "e"]  # "a" is processed downstream; "b" and "c" wrote nothing
    snap = log.snapshot()
    assert logged_inputs(snap) == [("d", 6), ("e", 0)] and log.snapshot_bytes == len(snap["inputs"])
    assert sum(snap["counts"]) == 20  # the counts before the first input kept: "a"'s outputs


def test_an_input_is_not_kept_for_a_backpressured_channel_it_sent_nothing_to():
    c = _Channels()
    log = OutputLog(c.writer, unprocessed_per_channel=0, subtask_index=0)
    for j in range(30):  # channel 1 holds queued buffers (of inputs forgotten already)
        c.writer.emit((_key_on(1), "z", j))
    process = log.wrap(_outputs(c, _key_on(0)))
    process(("a", 20))
    c.writer.flush_all()
    c.send(0, c.channels[0].buffers)
    assert c.channels[1].buffers > 0
    process(("b", 0))
    process(("c", 0))
    log.trim()
    assert not log.records  # "a" went whole to channel 0, all of it processed; "b" and "c" wrote nothing


def test_a_replay_sends_each_output_again_tagged_with_the_old_producer_and_its_count():
    c = _Channels()
    k = _key_on(1)
    counts = [0] * MAXP
    g = key_group(k, MAXP)
    counts[g] = 7
    log = OutputLog(c.writer, 2, 0)
    log.restored = [{"producer": 3, "counts": counts, "inputs": pickle.dumps(["x", "y"])}]
    n = log.replay(lambda emit: lambda r: [emit((k, r, j)) for j in range(2)])
    assert n == 2
    from spark_plugin.network.framing import decode_records

    sent = [r for item in c.channels[1].queue for r in decode_records(item.data)]
    assert [(r.producer, r.count, r.record) for r in sent] == [
        (3, 8, (k, "x", 0)), (3, 9, (k, "x", 1)), (3, 10, (k, "y", 0)), (3, 11, (k, "y", 1)),
    ]
    assert not c.channels[0].queue


# ------------------------------------------------------------------------------------------------ the consumer


def test_a_consumer_counts_per_producer_and_key_group_and_drops_the_regenerated_records_it_had_processed():
    seen: list = []
    counts = InputCounts({"flat": lambda r: r[0]}, MAXP, (0, MAXP - 1))
    k1, k2 = 1, 2
    g1, g2 = key_group(k1, MAXP), key_group(k2, MAXP)
    counts.restore({"flat": {g1: {0: 2}, g2: {1: 5}}})
    process = counts.wrap(seen.append, "flat", 0)
    for n in (1, 2, 3):
        process(Regenerated(0, n, (k1, n)))  # 1 and 2 were in the restored state
    process(Regenerated(1, 5, (k2, 5)))  # processed before, from producer 1
    process(Regenerated(1, 6, (k2, 6)))
    process(Regenerated(0, 1, (k2, 1)))  # producer 0 had sent nothing of k2's group before the checkpoint
    process((k1, "new"))
    assert seen == [(k1, 3), (k2, 6), (k2, 1), (k1, "new")]
    # only records of this attempt count (the regenerated ones are the old attempt's)
    assert counts.snapshot() == {"flat": {g1: {0: 1}}}


def test_a_consumer_restores_only_the_counts_of_its_own_key_groups():
    counts = InputCounts({"flat": lambda r: r[0]}, MAXP, (0, 3))
    counts.restore({"flat": {1: {0: 4}, 6: {0: 9}}})
    assert counts.restored == {"flat": {1: {0: 4}}}
