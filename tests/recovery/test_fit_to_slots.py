"""Fitting a pipeline to the slots Spark offers (without Spark): the parallelism chosen for a number of slots, and the
supervisor that scales a run down after a lost executor and back up once the slots return."""

from __future__ import annotations

import time

import pytest

import spark_plugin.driver.supervisor as supervisor
from contract.models import AfterAttempt
from spark_plugin import FitToSlots, FixedDelay, Pipeline, PipelineError
from spark_plugin.connectors import DiscardSink, SequenceSource
from spark_plugin.driver.run import RunFailed, RunResult
from spark_plugin.driver.scaling import fit
from tests.recovery.test_supervisor_rules import FakeClient, plan


def pipeline(src: int = 2, count: int = 6, sink: int = 2) -> Pipeline:
    p = Pipeline("fit", parallelism=src)
    (
        p.source(SequenceSource(count=10), id="src")
        .key_by(lambda r: r[0])
        .process(lambda k, r, s: [r], id="count", parallelism=count)
        .rebalance()
        .map(str, id="fmt", parallelism=sink)
        .sink(DiscardSink(), id="out")
    )
    return p


@pytest.mark.parametrize(
    ("slots", "expected"),
    [
        (10, {"src": 2, "count": 6, "fmt": 2}),  # fits as it is
        (5, {"src": 1, "count": 3, "fmt": 1}),  # every vertex halved
        (4, {"src": 1, "count": 2, "fmt": 1}),
        (3, {"src": 1, "count": 1, "fmt": 1}),  # down to min_parallelism everywhere
        (7, {"src": 2, "count": 4, "fmt": 1}),  # rounded down to 6, then the furthest below full raised: no slot idle
        (9, {"src": 2, "count": 5, "fmt": 2}),
    ],
)
def test_the_parallelism_chosen_fits_the_slots_and_keeps_the_proportions(slots, expected):
    got = fit(pipeline().plan(), slots, min_parallelism=1)
    assert got == expected and sum(got.values()) <= slots


def test_a_pipeline_that_cannot_fit_even_at_min_parallelism_is_refused_naming_what_it_needs():
    with pytest.raises(PipelineError, match="needs at least 6 task slots at min_parallelism 2, but Spark offers 5"):
        fit(pipeline().plan(), 5, min_parallelism=2)


def test_vertices_tied_by_a_forward_edge_keep_equal_parallelism():
    p = Pipeline("fanout", parallelism=4)
    s = p.source(SequenceSource(count=10), id="src")
    s.map(str, id="a").sink(DiscardSink(), id="out-a")  # src has two forward consumers: nothing chains
    s.map(str, id="b").sink(DiscardSink(), id="out-b")
    got = fit(p.plan(), 7, min_parallelism=1)
    assert len(set(got.values())) == 1 and sum(got.values()) <= 7


def test_slots_left_by_rounding_down_go_to_the_vertices_furthest_below_their_parallelism():
    p = Pipeline("two", parallelism=4)
    p.source(SequenceSource(count=10), id="src").rebalance().map(str, id="m").sink(DiscardSink(), id="out")
    for slots in range(2, 8):
        got = fit(p.plan(), slots, min_parallelism=1)
        assert sum(got.values()) == slots and max(got.values()) - min(got.values()) <= 1, (slots, got)


@pytest.fixture
def scripted(monkeypatch):
    """run_pipeline records the parallelism it ran with; outcomes are scripted; slots follow a schedule."""
    FakeClient.checkpoints, FakeClient.finished, FakeClient.late_completion = [(5, 1), (8, 2)], [], None
    monkeypatch.setattr(supervisor, "OvertakeClient", FakeClient)
    monkeypatch.setattr(supervisor, "_wait_for_tasks_to_end", lambda spark: None)
    calls: list[dict] = []
    outcomes: list = []

    def run(pipeline, spark, coordinator, *, job_id, restore_from, fail_job_on_error, attempt_reason, job_group,
            **kwargs):
        calls.append({
            "parallelism": {v.id: v.parallelism for v in pipeline.plan().vertices},
            "restore_from": restore_from,
            "reason": attempt_reason,
        })
        outcome = outcomes[len(calls) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome() if callable(outcome) else outcome

    monkeypatch.setattr(supervisor, "run_pipeline", run)
    return calls, outcomes


class FakeSpark:
    class sparkContext:  # noqa: N801 - stands for SparkSession.sparkContext
        cancelled: list[str] = []

        @classmethod
        def cancelJobGroup(cls, group):  # noqa: N802 - Spark's name
            cls.cancelled.append(group)


def test_after_a_lost_executor_the_restart_runs_scaled_down_from_the_latest_checkpoint(scripted):
    calls, outcomes = scripted
    slots = iter([10, 5])
    outcomes += [RunFailed("job 1 attempt 1: executor lost", 1, 1, plan(None)), RunResult(1, 2, "finished")]
    result = supervisor.Supervisor(
        pipeline(), FixedDelay(3, 0.0), sleep=lambda s: None,
        fit_to_slots=FitToSlots(check_every=60, stabilization=0),
        slots=lambda spark: next(slots),
    ).run(FakeSpark, "http://c")
    assert result.status == "finished"
    assert calls[0]["parallelism"] == {"src": 2, "count": 6, "fmt": 2}
    assert calls[1]["parallelism"] == {"src": 1, "count": 3, "fmt": 1}
    assert calls[1]["restore_from"] == AfterAttempt(1)  # the coordinator chooses where attempt 1 left off
    assert "scaled down to the 5 task slots Spark offers (10 wanted): src 2->1, count 6->3, fmt 2->1" in calls[1]["reason"]
    assert calls[1]["reason"].startswith("restart 1 after: job 1 attempt 1: executor lost")


def test_a_scaled_down_run_is_stopped_and_scaled_back_up_once_the_slots_return(scripted):
    calls, outcomes = scripted
    slots = iter([5, 5, 10, 10])

    def cancelled_when_slots_return():
        end = time.monotonic() + 10
        while not FakeSpark.sparkContext.cancelled and time.monotonic() < end:
            time.sleep(0.01)
        raise RunFailed("job 1 attempt 2: Job cancelled", 1, 2, plan(5))

    outcomes += [cancelled_when_slots_return, RunResult(1, 3, "finished")]
    FakeSpark.sparkContext.cancelled = []
    result = supervisor.Supervisor(
        pipeline(), FixedDelay(0, 0.0), sleep=lambda s: None,
        fit_to_slots=FitToSlots(check_every=0.05, stabilization=0),
        slots=lambda spark: next(slots, 10),
    ).run(FakeSpark, "http://c")
    assert result.status == "finished" and result.restarts == []  # a scale-up is no restart
    assert FakeSpark.sparkContext.cancelled, "the scaled-down run was not stopped"
    assert calls[0]["parallelism"] == {"src": 1, "count": 3, "fmt": 1}
    assert calls[1]["parallelism"] == {"src": 2, "count": 6, "fmt": 2}
    assert calls[1]["restore_from"] == AfterAttempt(2)  # where the scaled-down attempt left off
    assert calls[1]["reason"].startswith("scaled back to full parallelism where attempt 2 left off")


def test_an_attempt_waits_for_registering_executors_before_it_scales_down(scripted):
    """Executors register one by one: within ``stabilization`` the run waits for the full slots, not scaling down
    to whatever registered first."""
    calls, outcomes = scripted
    slots = iter([0, 2, 6, 10])
    slept: list[float] = []
    outcomes += [RunResult(1, 1, "finished")]
    supervisor.Supervisor(
        pipeline(), FixedDelay(0, 0.0), sleep=slept.append, fit_to_slots=FitToSlots(stabilization=5),
        slots=lambda spark: next(slots),
    ).run(FakeSpark, "http://c")
    assert calls[0]["parallelism"] == {"src": 2, "count": 6, "fmt": 2}
    assert calls[0]["reason"] is None and len(slept) == 3


def test_past_stabilization_the_run_takes_the_slots_there_are(scripted):
    calls, outcomes = scripted
    outcomes += [RunResult(1, 1, "finished")]
    supervisor.Supervisor(
        pipeline(), FixedDelay(0, 0.0), sleep=lambda s: None, fit_to_slots=FitToSlots(stabilization=2),
        slots=lambda spark: 4,
    ).run(FakeSpark, "http://c")
    assert calls[0]["parallelism"] == {"src": 1, "count": 2, "fmt": 1}
    assert "scaled down to the 4 task slots" in calls[0]["reason"]


def test_too_few_slots_for_too_long_fails_the_run_saying_what_it_needs(scripted):
    calls, _ = scripted
    slept: list[float] = []
    with pytest.raises(PipelineError, match=r"needs at least 3 task slots at min_parallelism 1 \(10 at full "
                       r"parallelism\), but Spark offered 2 for 12s"):
        supervisor.Supervisor(
            pipeline(), FixedDelay(0, 0.0), sleep=slept.append,
            fit_to_slots=FitToSlots(stabilization=2, resource_wait=10), slots=lambda spark: 2,
        ).run(FakeSpark, "http://c")
    assert calls == [] and sum(slept) == 12


def test_a_restart_reports_what_its_own_attempt_restored_not_what_a_later_scale_up_restored(scripted):
    calls, outcomes = scripted
    slots = iter([10, 5])

    def cancelled_when_slots_return():
        end = time.monotonic() + 10
        while not FakeSpark.sparkContext.cancelled and time.monotonic() < end:
            time.sleep(0.01)
        raise RunFailed("job 1 attempt 2: Job cancelled", 1, 2, plan(5))  # the restart's attempt restored 5

    outcomes += [RunFailed("job 1 attempt 1: executor lost", 1, 1, plan(None)), cancelled_when_slots_return,
                 RunResult(1, 3, "finished", restore_plan=plan(8))]  # the scale-up restored 8
    FakeSpark.sparkContext.cancelled = []
    result = supervisor.Supervisor(
        pipeline(), FixedDelay(3, 0.0), sleep=lambda s: None,
        fit_to_slots=FitToSlots(check_every=0.05, stabilization=0),
        slots=lambda spark: next(slots, 10),
    ).run(FakeSpark, "http://c")
    assert len(calls) == 3 and result.attempt == 3
    [restart] = result.restarts
    assert (restart.failed_attempt, restart.attempt, restart.restored) == (1, 2, 5)
