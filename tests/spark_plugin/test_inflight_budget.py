"""The in-flight budget: a subtask that would persist more in-flight bytes than its checkpoint's budget takes it
aligned (its barriers stop overtaking where they are) or declines it, and the cut stays consistent."""

from __future__ import annotations

from spark_plugin.network.barrier import CheckpointBarrier
from spark_plugin.network.channel_items import Barrier, Buffer
from spark_plugin.network.input import InputGate
from spark_plugin.network.mailbox import Mailbox
from spark_plugin.plan.topology import ChannelInfo
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.consistency import assert_consistent_cut
from tests.spark_plugin.fakes import InMemoryCoordinator
from tests.spark_plugin.test_subtask_threads import SMALL, all_output, backpressured, cut, wait_for

INFOS = [ChannelInfo(f"in:a[{i}]->b[0]", "input") for i in range(2)]


def _gate() -> InputGate:
    return InputGate(INFOS, 2, 0, Mailbox())


def _barrier(cid: int = 1, **kw) -> CheckpointBarrier:
    return CheckpointBarrier(cid, 1_000, "unaligned", unaligned=True, inflight_budget=100, **kw)


# ------------------------------------------------------------------------------------------------ the gate


def test_the_bytes_in_flight_are_those_queued_ahead_of_the_checkpoints_barrier():
    gate = _gate()
    ch0, ch1 = gate.channels
    ch0.items.extend([Buffer(b"x" * 10), Buffer(b"y" * 20)])
    gate._queue_priority(ch0, _barrier())
    ch0.items.append(Buffer(b"z" * 40))  # after the barrier: not in flight for checkpoint 1
    ch1.items.extend([Buffer(b"w" * 7)])
    assert gate.inflight_bytes({0, 1}, 1) == 37
    assert gate.inflight_bytes({1}, 1) == 7


def test_holding_a_checkpoint_puts_its_priority_barrier_back_at_its_arrival_position():
    gate = _gate()
    ch0 = gate.channels[0]
    ch0.items.append(Buffer(b"a"))
    barrier = _barrier()
    gate._queue_priority(ch0, barrier)
    ch0.items.append(Buffer(b"b"))
    gate.hold(1)
    assert gate.next_priority() is None
    gate.priority_done(0, barrier)  # the loop finishing the announcement it was handling changes nothing
    kinds = [(type(item), getattr(item[0], "unaligned", item[0])) for item in ch0.items]
    assert kinds == [(Buffer, b"a"), (Barrier, False), (Buffer, b"b")]
    assert gate.poll()[1] == Buffer(b"a")  # the overtaken buffer is processed first
    assert type(gate.poll()[1]) is Barrier


def test_a_priority_barrier_of_a_held_checkpoint_arriving_later_queues_in_band():
    gate = _gate()
    gate.hold(1)
    ch1 = gate.channels[1]
    ch1.items.append(Buffer(b"a"))
    gate._queue_priority(ch1, _barrier())
    gate._queue_priority(ch1, _barrier(2))
    assert gate.next_priority()[1].checkpoint_id == 2  # a newer checkpoint is not held
    assert [type(item) for item in ch1.items][:2] == [Buffer, Barrier]


def test_an_aligned_barrier_of_a_held_checkpoint_never_turns_priority_at_its_deadline():
    gate = _gate()
    gate.hold(1)
    barrier = CheckpointBarrier(1, 1_000, "aligned_then_unaligned", alignment_timeout=5, inflight_budget=100)
    gate.channels[0].items.extend([Buffer(b"a"), Barrier(barrier)])
    assert gate.convert_due(10_000) == 0
    assert gate.next_priority() is None


def test_the_budget_travels_on_the_wire_with_the_barrier():
    b = CheckpointBarrier(3, 1_000, "unaligned", inflight_budget=65_536, over_inflight_budget="abort")
    assert CheckpointBarrier.decode(b.encode()) == b
    assert b.over_budget(65_537) and not b.over_budget(65_536)
    assert not CheckpointBarrier(3, 1_000, "unaligned").over_budget(10**12)


# ------------------------------------------------------------------------------------------------ threads


def _run_budgeted(count: int, triggers: list[tuple[int, int, str]]):
    coord = InMemoryCoordinator()
    run = ThreadedRun(backpressured(count), coord.reporter, coord.events, SMALL).start()
    slow = run.subtask("slow", 0)
    for i, (cid, budget, over) in enumerate(triggers):
        wait_for(lambda i=i: slow.records_in > 300 * (i + 1), "records to flow")
        coord.trigger(cid, "unaligned", inflight_budget=budget, over_inflight_budget=over)
        wait_for(lambda cid=cid: len(coord.acks.get(cid, {})) == 4 or any(d[0] == cid for d in coord.declines),
                 f"checkpoint {cid}")
    logs = {(v, i): list(run.subtask(v, i).checkpoints.log) for v, i in _subtasks()}
    results = run.join(120)
    return coord, results, logs


def _subtasks():
    return [(v, i) for v in ("src", "slow") for i in range(2)]


def _entry(logs, vertex: str, index: int, cid: int) -> dict:
    return next(e for e in logs[(vertex, index)] if e.get("checkpoint_id") == cid)


def test_under_backpressure_subtasks_over_a_small_budget_persist_nothing_and_the_cut_stays_consistent():
    coord, results, logs = _run_budgeted(6000, [(1, 1, "align"), (2, 1, "align")])
    assert all_output(results) == list(range(6000))
    fell_back = 0
    for cid in (1, 2):
        assert len(coord.acks[cid]) == 4, f"checkpoint {cid} did not complete"
        assert_consistent_cut(cut(coord, cid), 2)
        for (vertex, index), ack in coord.acks[cid].items():
            entry = _entry(logs, vertex, index, cid)
            assert entry["inflight_budget"] == 1
            # the ack says so: the coordinator counts the subtasks that fell back to aligned over the budget
            assert ack["metrics"]["aligned_over_budget"] is (entry["over_budget"] is not None)
            if entry["over_budget"] is not None:
                fell_back += 1
                assert entry["over_budget"] > 1
                assert not ack.get("channel_state") and not ack["metrics"]["unaligned"]
    assert fell_back, "no subtask passed a 1-byte budget: the pipeline was not backpressured"


def test_under_backpressure_a_large_budget_changes_nothing():
    coord, results, logs = _run_budgeted(6000, [(1, 2**40, "align")])
    assert all_output(results) == list(range(6000))
    assert_consistent_cut(cut(coord, 1), 2)
    assert all(ack["metrics"]["unaligned"] for ack in coord.acks[1].values())
    assert all(_entry(logs, v, i, 1)["over_budget"] is None for v, i in _subtasks())


def test_under_backpressure_over_budget_with_abort_declines_and_the_next_checkpoint_completes():
    coord, results, _ = _run_budgeted(6000, [(1, 1, "abort"), (2, 2**40, "abort")])
    assert all_output(results) == list(range(6000))
    reasons = [d for d in coord.declines if d[0] == 1]
    assert reasons and "in-flight budget of 1 bytes" in str(reasons[0])
    assert len(coord.acks[2]) == 4
    assert_consistent_cut(cut(coord, 2), 2)

