"""Scaling on backpressure without Spark: what the judge decides from a run's live metrics, look by look, and the
supervisor that stops the run and restarts it at the parallelism decided (not counted as a restart)."""

from __future__ import annotations

import time

import pytest

import spark_plugin.driver.supervisor as supervisor
from contract.models import AfterAttempt, JobLiveMetrics, VertexLiveMetrics
from spark_plugin import FixedDelay, Pipeline, ScaleOnBackpressure
from spark_plugin.connectors import DiscardSink, SequenceSource
from spark_plugin.driver.autoscale import PressureJudge
from spark_plugin.driver.run import RunFailed, RunResult
from spark_plugin.driver.scaling import at_parallelism
from tests.recovery.test_fit_to_slots import FakeSpark
from tests.recovery.test_supervisor_rules import FakeClient, plan


def pipeline(work: int = 1, max_parallelism: int = 128) -> Pipeline:
    p = Pipeline("pressed", parallelism=1, max_parallelism=max_parallelism)
    (
        p.source(SequenceSource(count=10), id="src")
        .key_by(lambda r: r[0])
        .process(lambda k, r, s: [r], id="work", parallelism=work)
        .rebalance()
        .map(str, id="fmt")
        .sink(DiscardSink(), id="out")
    )
    return p


def live(attempt: int = 1, **vertices: tuple) -> JobLiveMetrics:
    """``vertex=(parallelism, records/s, backpressure)`` (backpressure both the max and the average), or with a
    fourth item the reporting subtasks and a fifth the replaying ones."""
    return JobLiveMetrics(
        job_id=1, attempt=attempt, now=0, max_age=5000,
        vertices=[
            VertexLiveMetrics(
                vertex=vid, parallelism=v[0], reporting=v[3] if len(v) > 3 else v[0], records_in_per_second=v[1],
                backpressure_max=v[2], backpressure_avg=v[2], replaying=v[4] if len(v) > 4 else 0, subtasks=[],
            )
            for vid, v in vertices.items()
        ],
    )


POLICY = ScaleOnBackpressure(max_parallelism=8, stabilization=10, settle=2, check_every=1)
PRESSED = {"src": (1, 900.0, 0.9), "work": (1, 900.0, 0.0), "fmt": (1, 900.0, 0.0)}


def judge(p: Pipeline, policy: ScaleOnBackpressure = POLICY, capacity=None, defined=None) -> PressureJudge:
    return PressureJudge(p.plan(), defined or {"src": 1, "work": 1, "fmt": 1}, policy,
                         {} if capacity is None else capacity)


def looks(j: PressureJudge, metrics: JobLiveMetrics, start: float, end: float, free: int = 10):
    """The judge's decisions at one look a second over [start, end]: (time, decision) of the first, or None."""
    t = start
    while t <= end:
        d = j.observe(t, metrics, free)
        if d is not None:
            return t, d
        t += 1
    return None


def test_a_vertex_whose_input_stays_backpressured_is_doubled_after_settle_and_stabilization():
    j = judge(pipeline())
    t, d = looks(j, live(**PRESSED), 0, 60)
    assert t == 12  # 2 s to settle, then pressed at every look for 10 s
    assert d.target == {"src": 1, "work": 2, "fmt": 1}
    assert d.reason.startswith("scaled up on backpressure: work 1->2: its input from src was backpressured 90% of "
                               "the time (at least 50%) for 10 s while work took 900 records/s")
    assert j.capacity == {"work": 900.0}  # what one subtask took while pressed


def test_a_look_without_the_pressure_starts_the_stabilization_again():
    j = judge(pipeline())
    assert looks(j, live(**PRESSED), 0, 8) is None
    calm = dict(PRESSED, src=(1, 900.0, 0.1))
    assert j.observe(9, live(**calm), 10) is None
    t, _ = looks(j, live(**PRESSED), 10, 60)
    assert t == 20


def test_a_vertex_that_is_itself_backpressured_is_not_the_bottleneck():
    both = dict(PRESSED, work=(1, 900.0, 0.8))  # work waits on fmt: fmt is what is slow
    j = judge(pipeline())
    t, d = looks(j, live(**dict(both, fmt=(1, 900.0, 0.0))), 0, 60)
    assert d.target == {"src": 1, "work": 1, "fmt": 2} and t == 12


@pytest.mark.parametrize("not_ready", [
    {"work": (2, 900.0, 0.0, 1)},  # one subtask of work does not report
    {"work": (1, 900.0, 0.0, 1, 1)},  # work replays restored data
])
def test_nothing_is_decided_until_every_subtask_reports_and_none_replays(not_ready):
    p = pipeline(work=2) if not_ready["work"][0] == 2 else pipeline()
    j = judge(p)
    metrics = dict(PRESSED, **not_ready)
    assert looks(j, live(**metrics), 0, 60) is None
    ready = dict(metrics, work=metrics["work"][:3])
    t, _ = looks(j, live(**ready), 61, 200)
    assert t == 61 + 12


def test_the_scale_up_is_bounded_by_the_free_slots_and_the_max_parallelism_and_the_key_groups():
    assert looks(judge(pipeline()), live(**PRESSED), 0, 60, free=0) is None  # no slot: nothing (said once in the log)
    _, d = looks(judge(pipeline(work=3)), live(**dict(PRESSED, work=(3, 900.0, 0.0))), 0, 60, free=1)
    assert d.target["work"] == 4  # 6 wanted, 1 slot free
    _, d = looks(judge(pipeline(work=3), ScaleOnBackpressure(max_parallelism=5, stabilization=10, settle=2)),
                 live(**dict(PRESSED, work=(3, 900.0, 0.0))), 0, 60)
    assert d.target["work"] == 5
    _, d = looks(judge(pipeline(work=3, max_parallelism=4)), live(**dict(PRESSED, work=(3, 900.0, 0.0))), 0, 60)
    assert d.target["work"] == 4  # its key groups
    assert looks(judge(pipeline(work=4, max_parallelism=4)), live(**dict(PRESSED, work=(4, 900.0, 0.0))), 0, 60) is None


def test_vertices_tied_by_a_forward_edge_are_scaled_together():
    p = Pipeline("tied", parallelism=1)
    m = p.source(SequenceSource(count=10), id="src").rebalance().map(str, id="m")
    m.map(str, id="a").sink(DiscardSink(), id="out-a")  # m has two forward consumers: nothing chains to it
    m.map(str, id="b").sink(DiscardSink(), id="out-b")
    ids = [v.id for v in p.plan().vertices]
    assert len(ids) == 4, ids  # src, m, and the two forward consumers
    j = PressureJudge(p.plan(), {v: 1 for v in ids}, POLICY, {})
    metrics = {v: (1, 500.0, 0.0) for v in ids}
    metrics[ids[0]] = (1, 500.0, 0.9)  # src waits on m
    _, d = looks(j, live(**metrics), 0, 60)
    assert d.target == {ids[0]: 1, ids[1]: 2, ids[2]: 2, ids[3]: 2}


def scaled_up() -> PressureJudge:
    p = pipeline()
    four = at_parallelism(p, p.plan(), {"src": 1, "work": 4, "fmt": 1})
    return PressureJudge(four.plan(), {"src": 1, "work": 1, "fmt": 1}, POLICY, {"work": 1000.0})


def test_once_the_pressure_is_gone_the_vertex_is_scaled_down_to_the_fewest_subtasks_with_headroom():
    j = scaled_up()
    # 1300 records/s: 2 subtasks (2 x 1000 x 0.7 = 1400) keep the headroom, 1 would not
    t, d = looks(j, live(src=(1, 1300.0, 0.05), work=(4, 1300.0, 0.0), fmt=(1, 1300.0, 0.0)), 0, 60)
    assert t == 12 and d.target == {"src": 1, "work": 2, "fmt": 1}
    assert d.reason.startswith("scaled down, the pressure gone: work 4->2: work took at most 1300 records/s for 10 s")


def test_the_busiest_look_of_the_window_decides_the_scale_down_and_never_below_the_pipelines_parallelism():
    j = scaled_up()
    quiet = live(src=(1, 100.0, 0.0), work=(4, 100.0, 0.0), fmt=(1, 100.0, 0.0))
    busier = live(src=(1, 2000.0, 0.0), work=(4, 2000.0, 0.0), fmt=(1, 2000.0, 0.0))  # 3 subtasks' worth
    for t in range(0, 8):
        assert j.observe(t, quiet, 10) is None
    assert j.observe(8, busier, 10) is None
    t, d = looks(j, quiet, 9, 60)
    assert d.target["work"] == 3  # the peak of 2000 records/s needs 3
    j = scaled_up()
    _, d = looks(j, quiet, 0, 60)
    assert d.target["work"] == 1  # 100 records/s: down to the defined parallelism, not below


def test_no_scale_down_while_the_input_is_still_pressed_or_without_a_measured_capacity():
    j = scaled_up()
    assert looks(j, live(src=(1, 100.0, 0.6), work=(4, 100.0, 0.0), fmt=(1, 100.0, 0.0)), 0, 60, free=0) is None
    p = pipeline()
    four = at_parallelism(p, p.plan(), {"src": 1, "work": 4, "fmt": 1})
    j = PressureJudge(four.plan(), {"src": 1, "work": 1, "fmt": 1}, POLICY, {})
    assert looks(j, live(src=(1, 100.0, 0.0), work=(4, 100.0, 0.0), fmt=(1, 100.0, 0.0)), 0, 60) is None


def test_bad_settings_are_refused_naming_the_setting():
    with pytest.raises(ValueError, match="max_parallelism 0"):
        ScaleOnBackpressure(max_parallelism=0)
    with pytest.raises(ValueError, match="high 1.5"):
        ScaleOnBackpressure(max_parallelism=2, high=1.5)
    with pytest.raises(ValueError, match="stabilization -1"):
        ScaleOnBackpressure(max_parallelism=2, stabilization=-1)
    with pytest.raises(ValueError, match="check_every 0"):
        ScaleOnBackpressure(max_parallelism=2, check_every=0)


class PressedClient(FakeClient):
    """The supervisor's coordinator calls, and the live metrics of a job whose ``work`` vertex is pressed while it
    runs at parallelism 1 and calm at 2."""

    attempt = 1

    def live_metrics(self, job_id):
        if PressedClient.attempt == 1:
            return live(attempt=1, **PRESSED)
        return live(attempt=PressedClient.attempt, src=(1, 50.0, 0.0), work=(2, 50.0, 0.0), fmt=(1, 50.0, 0.0))


def test_the_supervisor_stops_the_pressed_run_and_restarts_it_scaled_up_then_back_down(monkeypatch):
    FakeClient.checkpoints, FakeClient.finished, FakeClient.late_completion = [(5, 1)], [], None
    monkeypatch.setattr(supervisor, "OvertakeClient", PressedClient)
    monkeypatch.setattr(supervisor, "_wait_for_tasks_to_end", lambda spark: None)
    FakeSpark.sparkContext.cancelled = []
    calls: list[dict] = []

    def run(pipeline, spark, coordinator, *, job_id, restore_from, attempt_reason, job_group, on_attempt, **kwargs):
        attempt = len(calls) + 1
        calls.append({"parallelism": {v.id: v.parallelism for v in pipeline.plan().vertices},
                      "restore_from": restore_from, "reason": attempt_reason})
        PressedClient.attempt = attempt
        on_attempt(1, attempt)
        if attempt == 3:
            return RunResult(1, 3, "finished")
        end = time.monotonic() + 20
        while len(FakeSpark.sparkContext.cancelled) < attempt and time.monotonic() < end:
            time.sleep(0.01)
        raise RunFailed(f"job 1 attempt {attempt}: Job cancelled", 1, attempt, plan(5))

    monkeypatch.setattr(supervisor, "run_pipeline", run)
    fast = ScaleOnBackpressure(max_parallelism=4, stabilization=0.1, settle=0, check_every=0.02)
    result = supervisor.Supervisor(pipeline(), FixedDelay(0, 0.0), sleep=lambda s: None,
                                   slots=lambda spark: 8, scale_on_backpressure=fast).run(FakeSpark, "http://c")
    assert result.status == "finished" and result.restarts == []  # a rescale is no restart
    assert [c["parallelism"]["work"] for c in calls] == [1, 2, 1]
    assert calls[1]["restore_from"] == AfterAttempt(1) and calls[2]["restore_from"] == AfterAttempt(2)
    assert calls[1]["reason"].startswith("scaled up on backpressure: work 1->2: its input from src")
    assert calls[1]["reason"].endswith("; where attempt 1 left off")
    assert calls[2]["reason"].startswith("scaled down, the pressure gone: work 2->1")
    assert [(s.attempt, s.target["work"]) for s in result.scalings] == [(1, 2), (2, 1)]
    assert len(FakeSpark.sparkContext.cancelled) == 2
