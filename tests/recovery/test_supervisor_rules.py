"""The supervisor's rules without Spark: which checkpoint a restart restores, and when it gives up."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import spark_plugin.driver.supervisor as supervisor
from contract.models import AfterAttempt
from spark_plugin.driver.restart import ExponentialBackoff, FixedDelay
from spark_plugin.driver.run import RunFailed, RunResult
from spark_plugin.driver.supervisor import RestartsExhausted, Supervisor


class FakeClient:
    """The two coordinator calls the supervisor makes; records ``finish_job``."""

    checkpoints: list = []
    finished: list = []

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def list_checkpoints(self, job_id, status=None, limit=50):
        return SimpleNamespace(items=[SimpleNamespace(id=i, attempt=a) for i, a in self.checkpoints])

    def finish_job(self, job_id, status, message, attempt=None):
        self.finished.append((job_id, status, message, attempt))
        if status == "FAILED" and self.late_completion:
            # a killed task's ack landed just before the job was FAILED; after that nothing can complete any more
            self.checkpoints.append(self.late_completion)

    late_completion: tuple | None = None


def plan(checkpoint_id, requested=None):
    """A restore plan that restored ``checkpoint_id`` (chosen: ``requested``, else the same)."""
    return SimpleNamespace(
        checkpoint_id=checkpoint_id, requested_checkpoint=checkpoint_id if requested is None else requested,
        fallbacks=[],
    )


@pytest.fixture
def fake(monkeypatch):

    FakeClient.checkpoints, FakeClient.finished, FakeClient.late_completion = [], [], None
    monkeypatch.setattr(supervisor, "OvertakeClient", FakeClient)
    monkeypatch.setattr(supervisor, "_wait_for_tasks_to_end", lambda spark: None)
    return FakeClient


def scripted(monkeypatch, outcomes):
    """run_pipeline that fails or succeeds as scripted; records each call's restore_from."""
    calls = []

    def run(pipeline, spark, coordinator, *, job_id, restore_from, fail_job_on_error, **kwargs):
        assert fail_job_on_error is False
        calls.append(restore_from)
        outcome = outcomes[len(calls) - 1]
        if isinstance(outcome, RunFailed):
            raise outcome
        return outcome

    monkeypatch.setattr(supervisor, "run_pipeline", run)
    return calls


def test_a_restart_has_the_coordinator_choose_where_the_failed_attempt_left_off(fake, monkeypatch):
    """Not a checkpoint id read before the attempt opens: a killed task's late ack could complete a newer one
    meanwhile and retention (retained=1) collect the id read, so the attempt could not open (a 409)."""
    calls = scripted(monkeypatch, [RunFailed("boom", 1, 2, plan(5)), RunResult(1, 3, "finished", restore_plan=plan(8))])
    result = Supervisor(object(), FixedDelay(3, 0.0), sleep=lambda s: None).run(None, "http://c", restore_from=5)
    assert calls == [5, AfterAttempt(2)]
    assert result.status == "finished"


def test_a_restart_records_what_the_coordinator_restored_for_it(fake, monkeypatch):
    # the coordinator chose checkpoint 8, where attempt 2 left off, and fell back to 7 (a blob of 8 was corrupt)
    scripted(monkeypatch, [RunFailed("boom", 1, 2, plan(5)), RunResult(1, 3, "finished", restore_plan=plan(7, 8))])
    result = Supervisor(object(), FixedDelay(3, 0.0), sleep=lambda s: None).run(None, "http://c")
    [restart] = result.restarts
    assert (restart.failed_attempt, restart.attempt, restart.restore_from, restart.restored) == (2, 3, 8, 7)


def test_backoff_delays_are_slept_between_restarts(fake, monkeypatch):
    slept = []
    failures = [RunFailed(f"boom {a}", 1, a, plan(None)) for a in (1, 2, 3)]
    scripted(monkeypatch, [*failures, RunResult(1, 4, "finished")])
    Supervisor(object(), ExponentialBackoff(initial=0.5, max_delay=1.5), sleep=slept.append).run(None, "http://c")
    assert slept == [0.5, 1.0, 1.5]


def test_exhausted_restarts_fail_the_job_with_the_reason_and_the_checkpoint_to_resume_from(fake, monkeypatch):
    fake.checkpoints = [(6, 2)]
    scripted(monkeypatch, [RunFailed("job 1 attempt 1: worker died", 1, 1, plan(None)),
                           RunFailed("job 1 attempt 2: worker died again", 1, 2, plan(None))])
    with pytest.raises(RestartsExhausted) as e:
        Supervisor(object(), FixedDelay(1, 0.0), sleep=lambda s: None).run(None, "http://c")
    failure = (
        "job 1 attempt 2: worker died again; gave up after 1 restart(s) as FixedDelay(max_restarts=1, delay=0.0) "
        "allows"
    )
    assert str(e.value) == failure + "; it can resume from checkpoint 6 (run it with job_id=1, restore_from=6)"
    assert e.value.resume_from == 6
    assert fake.finished == [(1, "FAILED", failure, 2)]


def test_the_checkpoint_to_resume_from_is_read_once_the_job_is_failed(fake, monkeypatch):
    """A killed task of the failed attempt may still complete a checkpoint until the job is FAILED (which aborts
    its pending checkpoints): the supervisor names the checkpoint only after that, so it names the latest."""
    fake.checkpoints = [(14, 2)]
    fake.late_completion = (15, 2)
    scripted(monkeypatch, [RunFailed("job 1 attempt 2: worker died", 1, 2, plan(None))])
    with pytest.raises(RestartsExhausted) as e:
        Supervisor(object(), FixedDelay(0, 0.0), sleep=lambda s: None).run(None, "http://c")
    assert e.value.resume_from == 15
    assert "it can resume from checkpoint 15" in str(e.value)


def test_a_failure_before_the_job_exists_is_not_restarted(fake, monkeypatch):
    scripted(monkeypatch, [RunFailed("no job", None, None)])
    with pytest.raises(RunFailed, match="no job"):
        Supervisor(object(), FixedDelay(5, 0.0), sleep=lambda s: None).run(None, "http://c")
