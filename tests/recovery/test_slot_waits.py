"""A restart short of task slots (the cluster lost a worker and has not replaced it yet), without Spark: the attempt
opens saying that it waits, for how long and what was lost, waits within its bound, and when the slots do not come
back the job is FAILED naming the lost executor, never left RUNNING. A stand-in Spark session and coordinator
client run the real ``run_pipeline``; the slots Spark offers follow a script."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest

import spark_plugin.driver.run as run
import spark_plugin.driver.supervisor as supervisor
from contract.models import AfterAttempt, RestorePlan
from spark_plugin import FitToSlots, FixedDelay
from spark_plugin.driver.executors import Executor
from spark_plugin.driver.run import SlotWait
from spark_plugin.driver.supervisor import RestartsExhausted, Supervisor
from tests.recovery.test_fit_to_slots import pipeline
from tests.recovery.test_supervisor_rules import FakeClient

LOST = Executor("1", "10.0.0.7:40213", False, "worker lost", "10.0.0.7:8081")
SPARK_LOST = (
    "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Could not recover from a failed barrier "
    "ResultStage. Most recent failure reason: Stage failed because barrier task ResultTask(0, 3) finished "
    "unsuccessfully.\n"
    "ExecutorLostFailure (executor 1 exited caused by one of the running tasks) Reason: Remote RPC client "
    "disassociated. Likely due to containers exceeding thresholds, or network issues.\n"
    "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2898)\n"
)


class Coordinator:
    """The calls ``run_pipeline`` makes: records each attempt's restore request and reason, and what ended the job."""

    attempts: list[dict] = []
    finished: list = []

    def __init__(self, *args, **kwargs) -> None:
        pass

    def get_job(self, job_id):
        return SimpleNamespace(id=job_id, graph=pipeline().plan().graph())

    def start_attempt(self, job_id, restore_from, parallelism=None, wait_for_running=False, reason=None):
        self.attempts.append({"restore_from": restore_from, "reason": reason})
        number = len(self.attempts)
        restored = {1: None, 2: 6}[number]
        return SimpleNamespace(
            attempt=number, task_token=None,
            restore_plan=RestorePlan(job_id=job_id, checkpoint_id=restored, requested_checkpoint=restored),
        )

    def event_history(self, job_id, after=None, limit=1000):
        return []

    def finish_job(self, job_id, status, message, attempt=None):
        self.finished.append((status, message, attempt))

    def close(self) -> None:
        pass


class LostExecutor(Exception):
    def __str__(self) -> str:
        return SPARK_LOST


class Stage:
    """``sc.parallelize(...).barrier().mapPartitions(...).collect()``: the stage fails as a lost executor fails it."""

    def barrier(self):
        return self

    def mapPartitions(self, f):  # noqa: N802 - Spark's name
        return self

    def collect(self):
        raise LostExecutor()


class Context:
    master = "spark://10.0.0.5:7077"

    def parallelize(self, data, n):
        return Stage()

    def setJobGroup(self, group, description, interruptOnCancel=False):  # noqa: N802, N803 - Spark's names
        pass


@pytest.fixture
def cluster(monkeypatch):
    """Spark lost executor 1 with its worker when the stage failed."""
    Coordinator.attempts, Coordinator.finished = [], []
    FakeClient.checkpoints, FakeClient.finished, FakeClient.late_completion = [], [], None
    monkeypatch.setattr(run, "OvertakeClient", Coordinator)
    monkeypatch.setattr(supervisor, "OvertakeClient", FakeClient)
    monkeypatch.setattr(supervisor, "_wait_for_tasks_to_end", lambda spark: None)
    monkeypatch.setattr(supervisor, "active_ids", lambda sc: frozenset({"0", "1"}))
    monkeypatch.setattr(supervisor, "lost_since", lambda sc, before: [LOST])
    return SimpleNamespace(sparkContext=Context())


def test_a_restart_short_of_slots_waits_for_them_saying_so_then_fails_the_job_naming_the_lost_executor(cluster):
    offered = iter([10])  # the first attempt has its 10 slots; then the lost worker's 4 are missing
    slept: list[float] = []
    with pytest.raises(RestartsExhausted) as e:
        Supervisor(pipeline(), FixedDelay(3, 0.0), sleep=slept.append, slots=lambda spark: next(offered, 6),
                   slot_wait=30).run(cluster, "http://c", job_id=1)
    first, second = Coordinator.attempts
    assert second["restore_from"] == AfterAttempt(1)
    lost = "executor 1 on 10.0.0.7:40213, worker UI 10.0.0.7:8081 (worker lost)"
    assert second["reason"] == (
        "restart 1 after: job 1 attempt 1: the Spark barrier stage failed: ExecutorLostFailure (executor 1 exited "
        "caused by one of the running tasks) Reason: Remote RPC client disassociated. Likely due to containers "
        f"exceeding thresholds, or network issues.; lost {lost}; "
        f"waiting up to 30 s for 10 task slots (Spark offers 6; lost {lost})"
    )
    failure = (
        "job 1 attempt 2: the Spark barrier stage needs 10 task slots, but the Spark master 'spark://10.0.0.5:7077' "
        f"offered 6 for 30 s (lost {lost}); add executors, or run with fit_to_slots=FitToSlots() to go on with "
        "fewer; gave up waiting for task slots"
    )
    assert FakeClient.finished == [(1, "FAILED", failure, 2)]  # the job is FAILED, not left RUNNING
    assert str(e.value).startswith(failure) and e.value.resume_from == 6  # what attempt 2 restored
    assert sum(slept) == 30.0  # the wait's bound, in polls


def test_the_restart_runs_once_the_slots_are_back(cluster, monkeypatch):
    offered = iter([10, 6, 6, 10])
    ran: list[dict] = []

    def collected_once_slots_are_back(self):
        if len(Coordinator.attempts) == 1:
            raise LostExecutor()
        ran.append(Coordinator.attempts[-1])
        return [pickle.dumps(SimpleNamespace(vertex="src", subtask_index=0, status="finished", outputs={}))]

    monkeypatch.setattr(Stage, "collect", collected_once_slots_are_back)
    result = Supervisor(pipeline(), FixedDelay(3, 0.0), sleep=lambda s: None, slots=lambda spark: next(offered),
                        slot_wait=30).run(cluster, "http://c", job_id=1, finish=False)
    assert ran == [Coordinator.attempts[1]] and "waiting up to 30 s for 10 task slots (Spark offers 6" in ran[0]["reason"]
    [restart] = result.restarts
    assert (restart.attempt, restart.restored) == (2, 6)  # what the coordinator's attempt 2 restored
    assert "lost executor 1 on 10.0.0.7:40213" in restart.error


def test_fit_to_slots_short_even_of_min_parallelism_fails_the_job_naming_the_lost_executor(cluster):
    offered = iter([10, 10])  # fitted, then run: the first attempt has its 10 slots
    with pytest.raises(RestartsExhausted, match="needs at least 3 task slots at min_parallelism 1"):
        Supervisor(
            pipeline(), FixedDelay(3, 0.0), sleep=lambda s: None, slots=lambda spark: next(offered, 2),
            fit_to_slots=FitToSlots(stabilization=1, resource_wait=5),
        ).run(cluster, "http://c", job_id=1)
    [(job, status, message, attempt)] = FakeClient.finished
    assert (job, status, attempt) == (1, "FAILED", 1)
    assert "lost executor 1 on 10.0.0.7:40213, worker UI 10.0.0.7:8081 (worker lost)" in message


def test_a_wait_for_slots_polls_within_its_bound():
    offered = iter([4, 4, 8])
    slept: list[float] = []
    wait = SlotWait(10, lambda: next(offered), sleep=slept.append, poll=2)
    assert wait.until(8) == 8 and slept == [2, 2]
    never = SlotWait(5, lambda: 4, sleep=slept.append, poll=2)
    assert never.until(8) == 4


def test_a_long_reason_is_cut_in_the_middle_to_what_the_coordinator_takes():
    from spark_plugin.driver.run import REASON_LIMIT, _clamped

    reason = "restart 1 after: " + "x" * 3000 + "; waiting up to 120 s for 4 task slots (Spark offers 2)"
    cut = _clamped(reason)
    assert len(cut) <= REASON_LIMIT and cut.startswith("restart 1 after: ")
    assert cut.endswith("waiting up to 120 s for 4 task slots (Spark offers 2)")


class Seq(list):
    """A Scala Seq as py4j shows it."""

    def size(self):
        return len(self)

    def apply(self, i):
        return self[i]


class Option:
    def __init__(self, value=None) -> None:
        self.value = value

    def isDefined(self):  # noqa: N802 - Scala's name
        return self.value is not None

    def get(self):
        return self.value


class Logs(dict):
    def contains(self, key):
        return key in self

    def get(self, key):
        return Option(dict.get(self, key))


def summary(id_, active, reason=None):
    logs = Logs(stdout=f"http://10.0.0.{id_}:8081/logPage/?appId=app-1&executorId={id_}&logType=stdout")
    return SimpleNamespace(
        id=lambda: id_, hostPort=lambda: f"10.0.0.{id_}:40213", isActive=lambda: active,
        removeReason=lambda: Option(reason), executorLogs=lambda: logs,
    )


class StatusOfSpark:
    """``sc._jsc.sc()``: the status store learns of a removal ``lag`` looks after the scheduler dropped it."""

    def __init__(self, lag: int) -> None:
        self.lag = lag

    def statusStore(self):  # noqa: N802 - Spark's name
        return self

    def executorList(self, active_only):  # noqa: N802 - Spark's name
        self.lag -= 1
        removed = self.lag < 0
        return Seq([summary("driver", True), summary("0", True), summary("1", not removed, "worker lost")])

    def getExecutorIds(self):  # noqa: N802 - Spark's name
        return Seq(["0"])


def test_a_lost_executor_is_named_once_the_status_store_learned_what_the_scheduler_knows():
    from spark_plugin.driver.executors import describe, lost_since

    spark = StatusOfSpark(lag=3)
    sc = SimpleNamespace(_jsc=SimpleNamespace(sc=lambda: spark))
    slept: list[float] = []
    lost = lost_since(sc, {"0", "1"}, settle=5, sleep=slept.append)
    assert describe(lost) == "executor 1 on 10.0.0.1:40213, worker UI 10.0.0.1:8081 (worker lost)"
    assert len(slept) == 3
