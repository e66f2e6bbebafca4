"""The driver-side supervisor: runs a pipeline's attempts and restarts a failed barrier stage.

    result = Supervisor(pipeline, restart=FixedDelay(max_restarts=3, delay=1.0)).run(spark, coordinator=url)
    result = pipeline.run(spark, url, restart=ExponentialBackoff(initial=0.5, max_delay=30))   # the same

When the Spark barrier stage fails (a subtask's process died, a task raised, a peer vanished), the supervisor
waits as its :mod:`restart strategy <spark_plugin.driver.restart>` says and opens a new attempt with the coordinator,
which aborts the pending checkpoints of the failed attempt and returns a verified restore plan. First it waits
until Spark has killed the failed stage's remaining tasks, so no late ack of the old attempt completes a checkpoint
behind its back. The new attempt restores the newest checkpoint completed by the failed attempt (or, when it
completed none, the checkpoint the failed attempt itself restored), falling back past corrupt or missing blobs as
the plan says. When the strategy gives up, the job is marked FAILED with a message that says why, and
:class:`RestartsExhausted` is raised with that message and the checkpoint the job can resume from, read from the
coordinator once the job is FAILED (so no late acknowledgement can make it stale).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from client.sync import OvertakeClient
from spark_plugin.api.errors import PipelineError
from spark_plugin.api.pipeline import PipelineDefinition
from spark_plugin.driver.restart import FixedDelay, RestartStrategy
from spark_plugin.driver.run import RunFailed, RunResult, run_pipeline, task_slots
from spark_plugin.driver.scaling import FitToSlots, SlotWatch, at_parallelism, fit, floor_slots
from spark_plugin.task.coordination import DEFAULT_MAX_OUTAGE, patiently

log = logging.getLogger("overtake.supervisor")


class RestartsExhausted(RunFailed):
    """The restart strategy gave up; the message names the last failure and the checkpoint to resume from."""

    def __init__(
        self, message: str, job_id: int | None, attempt: int | None, resume_from: int | None, restore_plan: Any = None
    ) -> None:
        super().__init__(message, job_id, attempt, restore_plan)
        self.resume_from = resume_from


@dataclass
class Restart:
    """One restart: the attempt that failed and why, how long the supervisor waited, what the next one restored."""

    failed_attempt: int | None
    error: str
    delay: float
    restore_from: int | None
    restored: int | None = None
    fallbacks: list[dict] = field(default_factory=list)


@dataclass
class SupervisedResult:
    """The last attempt's :class:`RunResult` (attribute access falls through to it) and the restart history."""

    result: RunResult
    restarts: list[Restart] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        if name in ("result", "restarts"):
            raise AttributeError(name)
        return getattr(self.result, name)


class Supervisor:
    """Runs ``pipeline`` and restarts it after failures of its barrier stage, as ``restart`` says.

    With ``fit_to_slots`` (a :class:`~spark_plugin.driver.scaling.FitToSlots`), an attempt runs at the parallelism
    the slots Spark offers allow: after a lost executor the restart is scaled down from the latest completed
    checkpoint instead of failing or waiting, and once the slots are back the run is stopped and restarted at full
    parallelism from its latest completed checkpoint (that restart is not counted against ``restart``).
    """

    def __init__(
        self,
        pipeline: PipelineDefinition,
        restart: RestartStrategy | None = None,
        sleep=time.sleep,
        fit_to_slots: FitToSlots | None = None,
        slots: Callable[[Any], int] = lambda spark: task_slots(spark.sparkContext),
    ) -> None:
        self.pipeline = pipeline
        self.restart = restart if restart is not None else FixedDelay()
        self.sleep = sleep
        self.fit_to_slots = fit_to_slots
        self.slots = slots
        self.restarts: list[Restart] = []

    def run(self, spark: Any, coordinator: str, **kwargs: Any) -> SupervisedResult:
        """Like :func:`~spark_plugin.driver.run.run_pipeline` (same arguments), with restarts."""
        kwargs.pop("fail_job_on_error", None)
        # the supervisor outlasts its subtasks: a coordinator outage that made them give up (their
        # max_coordinator_outage) is what it waits through before it restarts them, up to the default at least
        patience = max(kwargs.get("max_coordinator_outage", DEFAULT_MAX_OUTAGE), DEFAULT_MAX_OUTAGE)
        job_id: int | None = kwargs.pop("job_id", None)
        restore_from = kwargs.pop("restore_from", "latest")
        reason: str | None = kwargs.pop("attempt_reason", None)
        self.restarts = []
        while True:
            pipeline, scaled = self._fitted(spark)
            if scaled:
                reason = "; ".join(r for r in (reason, scaled) if r)
            group = f"overtake-{uuid.uuid4().hex[:12]}"
            watch = self._watch_slots(spark, group) if scaled else None
            try:
                result = run_pipeline(
                    pipeline, spark, coordinator, job_id=job_id, restore_from=restore_from,
                    fail_job_on_error=False, attempt_reason=reason, job_group=group, **kwargs,
                )
            except RunFailed as e:
                if e.job_id is None:
                    raise
                job_id = e.job_id
                if self.restarts:
                    self._note_restored(e.restore_plan)
                _wait_for_tasks_to_end(spark)
                with OvertakeClient(coordinator, kwargs.get("token")) as client:
                    resume = partial(self._resume_point, client, job_id, e.attempt, e.restore_plan)
                    if watch is not None and watch.fired:
                        # stopped on purpose: the slots for full parallelism are back
                        restore_from = patiently(resume, f"reading job {job_id}'s checkpoints", patience)
                        reason = f"scaled back to full parallelism from checkpoint {restore_from}: the slots are back"
                        log.warning("job %s: %s", job_id, reason)
                        continue
                    number = len(self.restarts) + 1
                    delay = self.restart.delay_before(number)
                    if delay is None:
                        raise self._give_up(client, e, number - 1, patience) from e
                    restore_from = patiently(resume, f"reading job {job_id}'s checkpoints", patience)
                log.warning("%s; restart %d in %.2fs from %s", e, number, delay,
                            f"checkpoint {restore_from}" if restore_from is not None else "the beginning")
                self.restarts.append(Restart(e.attempt, str(e), delay, restore_from))
                reason = f"restart {number} after: {str(e)[:1500]}"
                self.sleep(delay)
                continue
            finally:
                if watch is not None:
                    watch.stop()
            if self.restarts:
                self._note_restored(result.restore_plan)
            return SupervisedResult(result, list(self.restarts))

    def _fitted(self, spark: Any) -> tuple[PipelineDefinition, str | None]:
        """The pipeline at the parallelism the free slots allow, and what was changed (None: as defined)."""
        if self.fit_to_slots is None:
            return self.pipeline, None
        plan = self.pipeline.plan()
        slots = self._wait_for_slots(spark, plan)
        parallelism = fit(plan, slots, self.fit_to_slots.min_parallelism)
        full = {v.id: v.parallelism for v in plan.vertices}
        if parallelism == full:
            return self.pipeline, None
        changes = ", ".join(f"{vid} {full[vid]}->{p}" for vid, p in parallelism.items() if p != full[vid])
        said = f"scaled down to the {slots} task slots Spark offers ({plan.num_subtasks} wanted): {changes}"
        log.warning("pipeline %s %s", plan.name, said)
        return at_parallelism(self.pipeline, plan, parallelism), said

    def _wait_for_slots(self, spark: Any, plan: Any, poll: float = 0.5) -> int:
        """The slots Spark offers once they reached the full parallelism, or ``stabilization`` seconds passed and
        they reach ``min_parallelism``; raises :class:`PipelineError` after ``resource_wait`` more seconds."""
        assert self.fit_to_slots is not None
        fts = self.fit_to_slots
        wanted, floor = plan.num_subtasks, floor_slots(plan, fts.min_parallelism)
        waited = 0.0
        while True:
            slots = self.slots(spark)
            if slots >= wanted or (slots >= floor and waited >= fts.stabilization):
                return slots
            if waited >= fts.stabilization + fts.resource_wait:
                raise PipelineError(
                    f"pipeline {plan.name!r} needs at least {floor} task slots at min_parallelism "
                    f"{fts.min_parallelism} ({wanted} at full parallelism), but Spark offered {slots} for "
                    f"{waited:.0f}s; add executors, or lower min_parallelism"
                )
            if waited == 0.0:
                log.warning("pipeline %s: Spark offers %d task slots, %d wanted; waiting up to %.0fs for more",
                            plan.name, slots, wanted, fts.stabilization)
            self.sleep(poll)
            waited += poll

    def _watch_slots(self, spark: Any, group: str) -> SlotWatch:
        assert self.fit_to_slots is not None
        return SlotWatch(
            lambda: self.slots(spark), self.pipeline.plan().num_subtasks, self.fit_to_slots.check_every,
            lambda: spark.sparkContext.cancelJobGroup(group),
        )

    def _note_restored(self, plan: Any) -> None:
        last = self.restarts[-1]
        if plan is not None:
            last.restored = plan.checkpoint_id
            last.fallbacks = [fb.model_dump() for fb in plan.fallbacks]

    @staticmethod
    def _resume_point(client: Any, job_id: int, failed_attempt: int | None, plan: Any) -> int | None:
        """The newest checkpoint the failed attempt completed, else the checkpoint it had restored.

        Only the failed attempt's own checkpoints descend from what it restored: a checkpoint of an older attempt
        that completed late (after that attempt was given up) is not on this lineage, and the sinks of the
        attempts since then have already dropped its pending output.
        """
        page = client.list_checkpoints(job_id, status="COMPLETED", limit=100)
        own = [c.id for c in page.items if c.attempt == failed_attempt]
        if own:
            return max(own)
        return plan.checkpoint_id if plan is not None else None

    def _give_up(self, client: Any, e: RunFailed, restarts: int, patience: float) -> RestartsExhausted:
        """Mark the job FAILED, then name the checkpoint it can resume from.

        In this order because the failed attempt's tasks may still be acknowledging while Spark kills them: once
        the job is FAILED its pending checkpoints are aborted and none of them can complete any more, so the
        checkpoint named is the coordinator's final word on the attempt.
        """
        failure = f"{e}; gave up after {restarts} restart(s) as {self.restart!r} allows"
        try:
            patiently(
                lambda: client.finish_job(e.job_id, "FAILED", failure, attempt=e.attempt),
                f"marking job {e.job_id} FAILED", patience,
            )
        except Exception as fe:  # noqa: BLE001 - the failure is reported by the exception returned
            log.warning("could not mark job %s FAILED: %s", e.job_id, fe)
        resume = patiently(
            partial(self._resume_point, client, e.job_id, e.attempt, e.restore_plan),
            f"reading job {e.job_id}'s checkpoints", patience,
        )
        where = (
            f"it can resume from checkpoint {resume} (run it with job_id={e.job_id}, restore_from={resume})"
            if resume is not None
            else "no checkpoint completed, so a new attempt would start from the beginning"
        )
        return RestartsExhausted(f"{failure}; {where}", e.job_id, e.attempt, resume, e.restore_plan)


def _wait_for_tasks_to_end(spark: Any, timeout: float = 30.0) -> None:
    """Wait until Spark has no active stage: after a barrier stage failed, its other tasks are being killed, and
    until they are gone they may still acknowledge (and complete) a checkpoint of the failed attempt."""
    try:
        tracker = spark.sparkContext.statusTracker()
    except Exception:  # noqa: BLE001 - no tracker (e.g. a stand-in session): nothing to wait for
        return
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not tracker.getActiveStageIds():
            return
        time.sleep(0.05)
    log.warning("Spark still has active stages %.0fs after the failure; restarting anyway", timeout)

