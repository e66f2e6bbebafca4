"""Running a pipeline on Spark: register the job and an attempt, then one barrier stage with one Spark task per
subtask (``spark_plugin.task.spark_task`` is each task's body)."""

from __future__ import annotations

import logging
import math
import os
import pickle
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from client.sync import OvertakeClient
from contract.graphs import IncompatibleGraph, rescaling
from contract.models import CheckpointConfig, EventType, JobCreate
from spark_plugin.api.errors import PipelineError
from spark_plugin.api.pipeline import PipelineDefinition
from spark_plugin.network.config import NetworkConfig
from spark_plugin.plan.topology import subtask_specs
from spark_plugin.task.coordination import DEFAULT_MAX_OUTAGE, patiently
from spark_plugin.task.spark_task import TaskBundle, run_task
from spark_plugin.task.subtask import SubtaskResult

log = logging.getLogger("overtake.run")


class RunFailed(RuntimeError):
    """The barrier stage failed; the message says which job and attempt, and the Spark error.

    ``job_id``, ``attempt`` and ``restore_plan`` (the attempt's ``RestorePlan``) let a supervisor restart it.
    """

    def __init__(self, message: str, job_id: int | None = None, attempt: int | None = None,
                 restore_plan: Any = None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.attempt = attempt
        self.restore_plan = restore_plan


class SlotsNotBack(RunFailed):
    """The attempt opened, but Spark did not offer the task slots its barrier stage needs within the wait."""


@dataclass
class SlotWait:
    """How :func:`run_pipeline` waits for task slots (the supervisor's restarts): it opens the attempt, saying in its
    reason (the job's status message) that it waits and for what, then polls ``slots()`` every ``poll`` seconds for
    up to ``seconds``; past that it raises :class:`SlotsNotBack`. ``lost`` names what the cluster lost (the
    executors), for both messages."""

    seconds: float
    slots: Callable[[], int]
    lost: str = ""
    sleep: Callable[[float], None] = time.sleep
    poll: float = 1.0

    def stated(self, needed: int, offered: int) -> str:
        since = f"; lost {self.lost}" if self.lost else ""
        return f"waiting up to {self.seconds:g} s for {needed} task slots (Spark offers {offered}{since})"

    def until(self, needed: int) -> int:
        """The slots Spark offers once they reach ``needed``, or when the wait is over (fewer)."""
        waited = 0.0
        while True:
            slots = self.slots()
            if slots >= needed or waited >= self.seconds:
                return slots
            self.sleep(self.poll)
            waited += self.poll


@dataclass
class RunResult:
    """The outcome of one run: the job and attempt it ran as, and every subtask's result."""

    job_id: int
    attempt: int
    status: str
    subtasks: list[SubtaskResult] = field(default_factory=list)
    duration: float = 0.0
    restore_plan: Any = None
    """The attempt's ``contract.models.RestorePlan``: the checkpoint restored and any ``fallbacks``."""

    def outputs(self, sink_id: str) -> list[Any]:
        """All records a :class:`~spark_plugin.sinks.CollectSink` with this operator id received."""
        out: list[Any] = []
        for s in sorted(self.subtasks, key=lambda s: (s.vertex, s.subtask_index)):
            got = s.outputs.get(sink_id)
            if got is not None and "records" in got:
                out.extend(got["records"])
        return out


def _check_limits(time_limit: float | None, stop_after_checkpoints: int | None) -> None:
    """What ends a run must be able to end it: a NaN time limit never passed (the run went on for ever), a
    negative one ended it before it started, and no count of checkpoints reaches 0."""
    if time_limit is not None and not (isinstance(time_limit, int | float) and 0 < time_limit < math.inf):
        raise ValueError(f"time_limit must be a number of seconds above 0 (or None: no limit), got {time_limit!r}")
    if stop_after_checkpoints is not None and not (
        isinstance(stop_after_checkpoints, int) and stop_after_checkpoints >= 1
    ):
        raise ValueError(
            f"stop_after_checkpoints must be a number of checkpoints of at least 1 (or None), got "
            f"{stop_after_checkpoints!r}"
        )


def task_slots(sc: Any) -> int:
    """How many tasks the Spark master can run at once (a barrier stage needs one slot per task).

    On a cluster this is what Spark's own barrier-stage check counts: the free task slots of the executors
    registered now (an executor lost with its worker is gone from it at once).
    """
    master = sc.master or ""
    cpus = int(sc.getConf().get("spark.task.cpus", "1") or 1)
    m = re.match(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?$", master)
    if m:
        n = m.group(1)
        cores = (os.cpu_count() or 1) if n == "*" else int(n or 1)
        return max(cores // cpus, 0)
    try:
        jsc = sc._jsc.sc()
        return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    except Exception:  # noqa: BLE001 - a Spark without that method: its default parallelism is the cores it has
        return max(sc.defaultParallelism // cpus, 0)


def _event_cursor(client: Any, job_id: int, attempt: int) -> int | None:
    """The id of this attempt's ``attempt.started`` event: tasks follow the events after it."""
    after: int | None = None
    cursor: int | None = None
    while True:
        page = client.event_history(job_id, after=after, limit=1000)
        for ev in page:
            if ev.type == EventType.attempt_started and ev.data.get("attempt") == attempt:
                cursor = ev.id
        if len(page) < 1000:
            return cursor
        after = page[-1].id


def run_pipeline(
    pipeline: PipelineDefinition,
    spark: Any,
    coordinator: str,
    *,
    checkpoint: Any = None,
    job_name: str | None = None,
    token: str | None = None,
    time_limit: float | None = None,
    network: NetworkConfig | None = None,
    restore_from: int | str | None = "latest",
    labels: dict[str, str] | None = None,
    job_id: int | None = None,
    finish: bool = True,
    stop_after_checkpoints: int | None = None,
    fail_job_on_error: bool = True,
    max_coordinator_outage: float = DEFAULT_MAX_OUTAGE,
    attempt_reason: str | None = None,
    job_group: str | None = None,
    wait_for_slots: SlotWait | None = None,
    on_attempt: Callable[[int, int], None] | None = None,
) -> RunResult:
    """Run ``pipeline`` on Spark as one barrier stage, checkpointed by the coordinator at ``coordinator``.

    ``checkpoint`` is a ``contract.models.CheckpointConfig`` (or dict); ``time_limit`` (seconds, above 0) ends the run
    even if the sources have not; a job cancelled through the coordinator ends it too. With ``job_id`` the run
    is a new attempt of that job, restored from ``restore_from`` ("latest" completed checkpoint, an id, or None
    for a fresh start), with the pipeline's parallelism (a vertex whose parallelism changed is rescaled: its state
    and in-flight data are redistributed); any other difference from the job's graph raises :class:`PipelineError`
    before Spark starts. Without ``job_id`` a new job is registered. With ``finish`` (the default) the job is marked
    FINISHED when the sources end or the time limit passes; ``finish=False`` leaves it open for another attempt.
    ``stop_after_checkpoints`` ends the run once that many checkpoints completed (tests, benchmarks).
    ``fail_job_on_error=False`` leaves the job open when the barrier stage fails (the supervisor restarts it).
    The time limit counts from the moment all Spark tasks of the stage are up. A subtask that cannot reach the
    coordinator for longer than ``max_coordinator_outage`` seconds fails (and with it the stage).
    ``attempt_reason`` says why the attempt starts (the job's status message while it runs); ``job_group`` names
    the Spark job group of the stage, so it can be cancelled. Without ``wait_for_slots`` a Spark that offers fewer
    task slots than the stage needs fails the run at once, before anything is registered; with it (a restart of an
    existing job) the attempt opens, says that it waits, and waits (see :class:`SlotWait`). ``on_attempt(job_id,
    attempt)`` is called once the attempt is open (the supervisor's watches follow that attempt's metrics).
    """
    _check_limits(time_limit, stop_after_checkpoints)
    plan = pipeline.plan()
    specs = subtask_specs(plan)
    sc = spark.sparkContext
    slots = wait_for_slots.slots() if wait_for_slots is not None else task_slots(sc)
    if slots < len(specs) and wait_for_slots is None:
        chains = ", ".join(f"{v.name} x{v.parallelism}" for v in plan.vertices)
        raise PipelineError(
            f"pipeline {plan.name!r} runs {len(specs)} subtasks ({chains}) as one Spark barrier stage, which needs "
            f"{len(specs)} task slots, but the Spark master {sc.master!r} offers {slots}; "
            f"use local[{len(specs)}] (or more executor cores)"
        )
    short = slots < len(specs)
    if short:
        assert wait_for_slots is not None
        said = wait_for_slots.stated(len(specs), slots)
        log.warning("pipeline %s: %s", plan.name, said)
        attempt_reason = "; ".join(r for r in (attempt_reason, said) if r)
    if checkpoint is None:
        checkpoint = CheckpointConfig()
    elif isinstance(checkpoint, dict):
        checkpoint = CheckpointConfig(**checkpoint)
    client = OvertakeClient(coordinator, token)
    try:
        if job_id is None:
            job = client.create_job(
                JobCreate(name=job_name or plan.name, graph=plan.graph(), checkpoint=checkpoint,
                          labels=labels or {})
            )
            changes: dict[str, int] = {}
        else:
            job = patiently(lambda: client.get_job(job_id), f"reading job {job_id}", max_coordinator_outage)
            try:
                changes = rescaling(job.graph, plan.graph(), job.id)
            except IncompatibleGraph as e:
                raise PipelineError(f"pipeline {plan.name!r} cannot run as job {job.id}: {e}") from None
        attempt = patiently(
            lambda: client.start_attempt(
                job.id, restore_from=restore_from, parallelism=changes or None, wait_for_running=True,
                reason=_clamped(attempt_reason),
            ),
            f"starting an attempt of job {job.id}", max_coordinator_outage,
        )
        if on_attempt is not None:
            on_attempt(job.id, attempt.attempt)
        if changes:
            log.info("job %s attempt %s runs rescaled: %s", job.id, attempt.attempt, changes)
        for fb in attempt.restore_plan.fallbacks:
            log.warning("job %s attempt %s: checkpoint %s passed over: %s", job.id, attempt.attempt,
                        fb.checkpoint_id, fb.reason)
        restore = {(s.vertex, s.subtask_index): s for s in attempt.restore_plan.subtasks}
        network = network or NetworkConfig()
        if attempt.restore_plan.rescaled and network.checkpoints_during_recovery:
            # a rescaled restore keeps keys in order only by the gates' recovery order across channels, which a
            # checkpoint's per-channel state cannot record: this attempt checkpoints once it replayed everything
            log.info("job %s attempt %s is rescaled: no checkpoints while it replays its in-flight data",
                     job.id, attempt.attempt)
            network = replace(network, checkpoints_during_recovery=False)
        if short:
            assert wait_for_slots is not None
            slots = wait_for_slots.until(len(specs))
            if slots < len(specs):
                lost = f" (lost {wait_for_slots.lost})" if wait_for_slots.lost else ""
                message = (
                    f"job {job.id} attempt {attempt.attempt}: the Spark barrier stage needs {len(specs)} task slots, "
                    f"but the Spark master {sc.master!r} offered {slots} for {wait_for_slots.seconds:g} s{lost}; add "
                    f"executors, or run with fit_to_slots=FitToSlots() to go on with fewer"
                )
                if fail_job_on_error:
                    _finish(client, job.id, "FAILED", message, attempt.attempt, max_coordinator_outage)
                raise SlotsNotBack(message, job.id, attempt.attempt, attempt.restore_plan)
            log.warning("pipeline %s: Spark offers the %d task slots again", plan.name, slots)
        after = patiently(
            lambda: _event_cursor(client, job.id, attempt.attempt), "reading the job's events", max_coordinator_outage
        )
        started = time.time()
        bundle = TaskBundle(
            plan=plan,
            specs=specs,
            coordinator=coordinator,
            token=attempt.task_token or token,
            job_id=job.id,
            attempt=attempt.attempt,
            events_after=after,
            time_limit=time_limit,
            stop_after_checkpoints=stop_after_checkpoints,
            network=network,
            restore=restore,
            restore_checkpoint=attempt.restore_plan.checkpoint_id,
            max_outage=max_coordinator_outage,
        )
        n = len(specs)
        description = f"overtake job {job.id} ({plan.name}) attempt {attempt.attempt}"
        if job_group is not None:
            sc.setJobGroup(job_group, description, interruptOnCancel=True)
        else:
            sc.setJobDescription(description)
        rdd = sc.parallelize(range(n), n).barrier().mapPartitions(lambda it: run_task(bundle, it))
        try:
            rows = rdd.collect()
        except Exception as e:
            message = f"job {job.id} attempt {attempt.attempt}: the Spark barrier stage failed: {_short(e)}"
            if fail_job_on_error:
                _finish(client, job.id, "FAILED", message, attempt.attempt, max_coordinator_outage)
            raise RunFailed(message, job.id, attempt.attempt, attempt.restore_plan) from e
        results = sorted((pickle.loads(r) for r in rows), key=lambda r: (r.vertex, r.subtask_index))
        statuses = {r.status for r in results}
        status = "finished" if statuses == {"finished"} else sorted(statuses - {"finished"})[0]
        if finish and not status.startswith("job "):
            _finish(
                client, job.id, "FINISHED", None if status == "finished" else status, attempt.attempt,
                max_coordinator_outage,
            )
        return RunResult(job.id, attempt.attempt, status, results, time.time() - started, attempt.restore_plan)
    finally:
        client.close()


REASON_LIMIT = 2000
"""Characters of an attempt's reason the coordinator takes (``AttemptCreate.reason``)."""


def _clamped(reason: str | None) -> str | None:
    """The reason within the coordinator's limit, cut in the middle: its start says why the attempt starts, its end
    what it waits for."""
    if reason is None or len(reason) <= REASON_LIMIT:
        return reason
    half = (REASON_LIMIT - 3) // 2
    return f"{reason[:half]} … {reason[-half:]}"


_RAISED = re.compile(r"^[\w.]*(SubtaskFailed|PipelineError|Error|Exception): ")
"""A line of a Python traceback that names the exception raised (not a source line that mentions it)."""


def _short(e: BaseException) -> str:
    """The line of Spark's error that says why the stage failed: the Python exception a task raised (the last one of
    its traceback, not the JVM's wrappers around it); Spark's own reason when no Python exception is in it."""
    text = str(e)
    lines = [line.strip() for line in text.splitlines()]
    raised = [line for line in lines if _RAISED.match(line)]
    python = [line for line in raised if not line.startswith(_JVM_WRAPPERS)]
    for wanted in ("SubtaskFailed", "PipelineError"):
        for line in python:
            if wanted in _RAISED.match(line).group(0):  # type: ignore[union-attr]
                return line[:500]
    if python:
        return python[-1][:500]
    # a task lost with its executor raised nothing: Spark's reason names the executor (py4j's first line only names
    # the call that failed, "An error occurred while calling z:...PythonRDD.collectAndServe")
    for line in lines:
        if line.startswith("ExecutorLostFailure"):
            return line[:500]
    jvm = [line.removeprefix(": ") for line in lines if _RAISED.match(line.removeprefix(": "))]
    if jvm:
        return jvm[0][:500]
    return lines[0][:500] if text.strip() else type(e).__name__


_JVM_WRAPPERS = ("org.apache.", "py4j.", "java.", "scala.", "pyspark.errors.")


def _finish(
    client: Any, job_id: int, status: str, message: str | None, attempt: int, max_outage: float = DEFAULT_MAX_OUTAGE
) -> None:
    """Mark the job ended; a coordinator that is down (restarting) is waited for, up to ``max_outage`` seconds."""
    try:
        patiently(
            lambda: client.finish_job(job_id, status, message, attempt=attempt),
            f"marking job {job_id} {status}", max_outage,
        )
    except Exception as e:  # noqa: BLE001 - the run's outcome matters more than the bookkeeping
        log.warning("could not mark job %s %s: %s", job_id, status, e)
