"""The host's ack relay against a live coordinator with tokens: acks of several subtasks go as one request, every
subtask gets its own ack's answer, and a relay that is wrong, away or gone never costs an ack."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from client.errors import Conflict, CoordinatorUnreachable, NotFound, Unauthorized
from client.sync import OvertakeClient
from spark_plugin.task import ack_relay
from spark_plugin.task.ack_relay import AckRelay, RelayClient, RelayReporter, RelayUnusable, relay_of
from spark_plugin.task.coordination import CheckpointDiscarded, SubtaskIdentity

N = 6


@pytest.fixture
def admin(secured_coordinator):
    with OvertakeClient(secured_coordinator.url, token=secured_coordinator.admin_token) as c:
        yield c


@pytest.fixture
def job(admin):
    job = admin.create_job({
        "name": f"relay-{time.time_ns()}",
        "graph": {"vertices": [{"id": "v", "parallelism": N}]},
        "checkpoint": {"policy": "unaligned", "retained": 1, "timeout": 600_000},
    })
    attempt = admin.start_attempt(job.id)
    yield job, attempt
    admin.cancel_job(job.id)


class GatedClient:
    """The relay's SDK client, holding its first batch until the test opens the gate."""

    def __init__(self, client: OvertakeClient) -> None:
        self.client = client
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.batches: list[int] = []

    def ack_batch(self, job_id, checkpoint_id, acks):
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        self.batches.append(len(acks))
        return self.client.ack_batch(job_id, checkpoint_id, acks)


def _reporters(url, attempt, job_id, port, n=N):
    out = []
    for i in range(n):
        r = RelayReporter(OvertakeClient(url, attempt.task_token), SubtaskIdentity(job_id, attempt.attempt, "v", i),
                          token=attempt.task_token)
        r.use_relay(("127.0.0.1", port))
        out.append(r)
    return out


@contextlib.contextmanager
def _relayed(url, attempt, job_id, n):
    """A relay with the attempt's token and ``n`` subtasks' reporters connected to it; all closed afterwards."""
    relay = AckRelay(OvertakeClient(url, attempt.task_token), job_id, attempt.task_token)
    port = relay.start()
    reporters = _reporters(url, attempt, job_id, port, n)
    try:
        yield relay, port, reporters
    finally:
        for r in reporters:
            r.close()
        relay.close()


def _wait(cond, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def test_acks_waiting_together_go_as_one_request_and_complete_the_checkpoint(secured_coordinator, admin, job):
    job, attempt = job
    gated = GatedClient(OvertakeClient(secured_coordinator.url, attempt.task_token))
    relay = AckRelay(gated, job.id, attempt.task_token)
    port = relay.start()
    reporters = _reporters(secured_coordinator.url, attempt, job.id, port)
    try:
        cp = admin.trigger_checkpoint(job.id).id
        errors: list[BaseException] = []
        sent: dict[int, dict] = {}

        def ack(i: int) -> None:
            try:  # each subtask's own ack time, as its ack worker stamps it
                sent[i] = {"metrics": {"unaligned": True, "ack_timestamp": int(time.time() * 1000)}}
                reporters[i].ack(cp, sent[i])
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        first = threading.Thread(target=ack, args=(0,))
        first.start()
        assert gated.entered.wait(30)
        rest = [threading.Thread(target=ack, args=(i,)) for i in range(1, N)]
        for t in rest:
            t.start()
        _wait(lambda: relay.queued == N - 1, "the other acks to reach the relay")
        time.sleep(0.05)
        released = int(time.time() * 1000)
        gated.gate.set()
        for t in [first, *rest]:
            t.join(30)
        assert not errors, errors
        assert gated.batches == [1, N - 1]
        assert relay.requests == 2 and relay.acks == N
        assert all(r.relayed == 1 for r in reporters)
        done = admin.get_checkpoint(job.id, cp)
        assert done.status.value == "COMPLETED" and done.num_acknowledged_subtasks == N
        # each subtask's ack time is its own, not its batch's arrival: the first waited at the gate
        times = {s.subtask_index: s.ack_timestamp for s in done.subtasks}
        assert times[0] < released and len(set(times.values())) > 1
        # the same ack again, through the relay: a duplicate, answered as a success
        reporters[3].ack(cp, sent[3])
        assert reporters[3].relayed == 2
    finally:
        for r in reporters:
            r.close()
        relay.close()


def _ack_in_thread(reporter, cp: int, errors: list) -> threading.Thread:
    def run() -> None:
        try:
            reporter.ack(cp, {"metrics": {"unaligned": True}})
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t


def test_acks_that_keep_coming_are_held_together_until_a_pause(secured_coordinator, admin, job, monkeypatch):
    """Each ack of a checkpoint restarts the relay's LINGER: five acks spread over more than LINGER, each well
    within it of the one before, go as one request (one of the six subtasks never acks, so only the pause sends
    them)."""
    monkeypatch.setattr(ack_relay, "LINGER", 2.0)
    monkeypatch.setattr(ack_relay, "HOLD_MAX", 60.0)
    job, attempt = job
    with _relayed(secured_coordinator.url, attempt, job.id, N) as (relay, _, reporters):
        cp = admin.trigger_checkpoint(job.id).id
        errors: list[BaseException] = []
        threads = []
        for i in range(N - 1):
            if i:
                time.sleep(0.6)  # 2.4 s from the first to the last: past LINGER; each gap 1.4 s short of it
            threads.append(_ack_in_thread(reporters[i], cp, errors))
        for t in threads:
            t.join(30)
        assert not errors, errors
        assert relay.requests == 1 and relay.acks == N - 1
        assert admin.get_checkpoint(job.id, cp).num_acknowledged_subtasks == N - 1


def test_a_subtask_that_never_acks_holds_the_others_at_most_hold_max(secured_coordinator, admin, job, monkeypatch):
    monkeypatch.setattr(ack_relay, "LINGER", 60.0)
    monkeypatch.setattr(ack_relay, "HOLD_MAX", 0.3)
    job, attempt = job
    with _relayed(secured_coordinator.url, attempt, job.id, N) as (relay, _, reporters):
        cp = admin.trigger_checkpoint(job.id).id
        errors: list[BaseException] = []
        threads = [_ack_in_thread(reporters[i], cp, errors) for i in range(N - 1)]
        for t in threads:
            t.join(30)  # well within LINGER: only HOLD_MAX can have sent them
        assert not any(t.is_alive() for t in threads), "the relay held the acks past HOLD_MAX"
        assert not errors, errors
        assert relay.acks == N - 1
        assert admin.get_checkpoint(job.id, cp).num_acknowledged_subtasks == N - 1


def test_each_subtask_gets_its_own_refusal(secured_coordinator, admin, job):
    job, attempt = job
    with _relayed(secured_coordinator.url, attempt, job.id, 2) as (_, port, reporters):
        cp = admin.trigger_checkpoint(job.id).id
        reporters[0].ack(cp, {"metrics": {"unaligned": True}})
        # a different ack for the same subtask: 409, which to a subtask means its checkpoint is gone
        with pytest.raises(CheckpointDiscarded):
            reporters[0].ack(cp, {"metrics": {"unaligned": False}})
        # a subtask the graph does not have: 404 with the coordinator's message
        stranger = RelayReporter(OvertakeClient(secured_coordinator.url, attempt.task_token),
                                 SubtaskIdentity(job.id, attempt.attempt, "v", N + 3), token=attempt.task_token)
        stranger.use_relay(("127.0.0.1", port))
        with pytest.raises(NotFound, match="parallelism"):
            stranger.ack(cp, {})
        stranger.close()
        # an aborted checkpoint: discarded, and the other subtask's ack is unaffected by the neighbour's refusal
        with OvertakeClient(secured_coordinator.url, attempt.task_token) as third:
            third.decline(job.id, cp, {"attempt": attempt.attempt, "vertex": "v", "subtask_index": 2,
                                       "reason": "the test declines"})  # aborts the checkpoint
        with pytest.raises(CheckpointDiscarded):
            reporters[1].ack(cp, {})
        aborted = admin.get_checkpoint(job.id, cp)
        assert aborted.status.value == "ABORTED" and aborted.num_acknowledged_subtasks == 1


def test_a_relay_without_the_attempts_token_is_not_used_and_the_ack_goes_directly(secured_coordinator, admin, job):
    job, attempt = job
    relay = AckRelay(OvertakeClient(secured_coordinator.url, attempt.task_token), job.id, "another-token")
    port = relay.start()
    try:
        with pytest.raises(RelayUnusable, match="token"):
            RelayClient(("127.0.0.1", port), attempt.task_token)
        (r,) = _reporters(secured_coordinator.url, attempt, job.id, port, 1)
        assert r.relay is None
        cp = admin.trigger_checkpoint(job.id).id
        r.ack(cp, {})
        assert r.relayed == 0 and relay.acks == 0
        assert admin.get_checkpoint(job.id, cp).num_acknowledged_subtasks == 1
    finally:
        relay.close()


def test_a_relay_that_goes_away_costs_no_ack(secured_coordinator, admin, job):
    job, attempt = job
    with _relayed(secured_coordinator.url, attempt, job.id, 2) as (relay, _, reporters):
        cp = admin.trigger_checkpoint(job.id).id
        reporters[0].ack(cp, {})
        relay.close()
        reporters[1].ack(cp, {})  # the relay's task is gone: acked directly
        assert reporters[1].relay is None and reporters[1].relayed == 0
        assert admin.get_checkpoint(job.id, cp).status.value == "PENDING"
        assert admin.get_checkpoint(job.id, cp).num_acknowledged_subtasks == 2


def test_an_unreachable_coordinator_is_a_transient_error_for_the_subtask(secured_coordinator, admin, job):
    job, attempt = job
    dead = OvertakeClient("http://127.0.0.1:9", attempt.task_token, retries=0, timeout=2.0)
    relay = AckRelay(dead, job.id, attempt.task_token)
    port = relay.start()
    (r,) = _reporters(secured_coordinator.url, attempt, job.id, port, 1)
    try:
        with pytest.raises(CoordinatorUnreachable):  # the ack worker retries it with its backoff
            r.ack(1, {})
        assert r.relay is not None  # the relay itself works: it stays in use
    finally:
        r.close()
        relay.close()


def test_the_lowest_task_of_each_host_serves_it():
    peers = [
        {"task": 0, "host": "a", "relay": 5000},
        {"task": 1, "host": "b", "relay": 5001},
        {"task": 2, "host": "a", "relay": 5002},
        {"task": 3, "host": "b", "relay": 5003},
        {"task": 4, "host": "c", "relay": None},
    ]
    assert relay_of(peers, 2)["task"] == 0
    assert relay_of(peers, 3)["task"] == 1
    assert relay_of(peers, 1)["task"] == 1
    assert relay_of(peers, 4) is None


# --------------------------------------------------------------------------- live metrics through the relay


def _now_ms() -> int:
    return int(time.time() * 1000)


def _metrics_reporters(url, attempt, job_id, port, n=N):
    """Reporters as a Spark task makes them: acks and live metrics, through the relay at ``port``."""
    out = []
    for i in range(n):
        client = OvertakeClient(url, attempt.task_token)
        r = RelayReporter(client, SubtaskIdentity(job_id, attempt.attempt, "v", i), metrics_client=client,
                          token=attempt.task_token)
        r.use_relay(("127.0.0.1", port))
        out.append(r)
    return out


@contextlib.contextmanager
def _metrics_relay(url, attempt, job_id, n=N, **kw):
    relay = AckRelay(OvertakeClient(url, attempt.task_token), job_id, attempt.task_token, attempt=attempt.attempt,
                     metrics_client=OvertakeClient(url, attempt.task_token), **kw)
    port = relay.start()
    reporters = _metrics_reporters(url, attempt, job_id, port, n)
    try:
        yield relay, reporters
    finally:
        for r in reporters:
            r.close()
        relay.close()


def test_the_metrics_of_a_hosts_subtasks_go_as_one_request_each_with_its_own_figures_and_time(
    secured_coordinator, admin, job
):
    job, attempt = job
    # no flush of its own during the test: the test flushes once every sample arrived
    with _metrics_relay(secured_coordinator.url, attempt, job.id, metrics_flush=3600) as (relay, reporters):
        base = _now_ms() - 3000
        for i, r in enumerate(reporters):
            r.report_metrics({"records_in_per_second": 100.0 * (i + 1), "backpressure": i / 10}, base + 100 * i)
        _wait(lambda: len(relay._metrics) == N, "the relay to hold every subtask's sample")
        relay._flush_metrics()
        assert (relay.metrics_requests, relay.metrics_reports) == (1, N)
        assert [r.metrics_relayed for r in reporters] == [1] * N
        (v,) = admin.live_metrics(job.id).vertices
        shown = sorted(v.subtasks, key=lambda s: s.subtask_index)
        # each subtask's own figures and its own measuring time: the batch did not make them the relay's
        assert [s.timestamp for s in shown] == [base + 100 * i for i in range(N)]
        assert [s.metrics.records_in_per_second for s in shown] == [100.0 * (i + 1) for i in range(N)]
        assert v.reporting == N and v.backpressure_max == (N - 1) / 10


def test_the_relay_keeps_the_newest_sample_of_each_subtask():
    relay = AckRelay(None, 1, None, attempt=1, metrics_client=object())
    relay._offer_metrics({"vertex": "v", "subtask_index": 0, "timestamp": 200, "metrics": {"records_in": 2}})
    relay._offer_metrics({"vertex": "v", "subtask_index": 0, "timestamp": 100, "metrics": {"records_in": 1}})
    relay._offer_metrics({"vertex": "v", "subtask_index": 1, "timestamp": 50, "metrics": {"records_in": 5}})
    assert {k: m["metrics"]["records_in"] for k, m in relay._metrics.items()} == {("v", 0): 2, ("v", 1): 5}


def test_a_relay_that_takes_no_metrics_leaves_them_direct(secured_coordinator, admin, job):
    job, attempt = job
    relay = AckRelay(OvertakeClient(secured_coordinator.url, attempt.task_token), job.id, attempt.task_token)
    port = relay.start()
    (r,) = _metrics_reporters(secured_coordinator.url, attempt, job.id, port, 1)
    try:
        assert r.relay is not None and not r.relay.takes_metrics
        r.report_metrics({"records_in_per_second": 7.0}, _now_ms())
        assert r.metrics_relayed == 0
        (v,) = admin.live_metrics(job.id).vertices
        assert v.records_in_per_second == 7.0
    finally:
        r.close()
        relay.close()


def test_metrics_go_directly_once_the_relay_is_gone(secured_coordinator, admin, job):
    job, attempt = job
    with _metrics_relay(secured_coordinator.url, attempt, job.id, n=1, metrics_flush=3600) as (relay, (r,)):
        relay.close()
        deadline = time.monotonic() + 30
        n = 0
        # a write to a closed peer can succeed once before the reset comes back: samples until one goes directly
        while r.relay.takes_metrics:
            assert time.monotonic() < deadline, "the reporter kept handing samples to a relay that is gone"
            n += 1
            r.report_metrics({"records_in_per_second": float(n)}, _now_ms())
            time.sleep(0.01)
        (v,) = admin.live_metrics(job.id).vertices
        assert v.records_in_per_second == float(n)  # the last sample went directly


def test_a_metrics_batch_keeps_each_known_subtasks_report_and_refuses_an_unknown_one_alone(
    secured_coordinator, admin, job
):
    job, attempt = job
    t = _now_ms()
    with OvertakeClient(secured_coordinator.url, attempt.task_token) as task:
        result = task.report_metrics_batch(job.id, attempt.attempt, [
            {"vertex": "v", "subtask_index": 0, "timestamp": t, "metrics": {"records_in_per_second": 1.0}},
            {"vertex": "v", "subtask_index": N, "timestamp": t, "metrics": {"records_in_per_second": 2.0}},
            {"vertex": "w", "subtask_index": 0, "timestamp": t, "metrics": {"records_in_per_second": 3.0}},
        ])
        assert [i.status_code for i in result.items] == [204, 404, 404]
        assert f"vertex 'v' has parallelism {N}" in result.items[1].error and "no vertex 'w'" in result.items[2].error
        (v,) = admin.live_metrics(job.id).vertices
        assert (v.reporting, v.records_in_per_second) == (1, 1.0)
        with pytest.raises(Unauthorized, match="not attempt"):
            task.report_metrics_batch(job.id, attempt.attempt + 1, [
                {"vertex": "v", "subtask_index": 0, "timestamp": t + 1, "metrics": {}}])
    with pytest.raises(Conflict):
        admin.report_metrics_batch(job.id, attempt.attempt + 1, [
            {"vertex": "v", "subtask_index": 0, "timestamp": t + 1, "metrics": {}}])
    assert admin.live_metrics(job.id).vertices[0].records_in_per_second == 1.0  # nothing of a refused batch kept
