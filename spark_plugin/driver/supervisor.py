"""The driver-side supervisor: runs a pipeline's attempts and restarts a failed barrier stage.

    result = Supervisor(pipeline, restart=FixedDelay(max_restarts=3, delay=1.0)).run(spark, coordinator=url)
    result = pipeline.run(spark, url, restart=ExponentialBackoff(initial=0.5, max_delay=30))   # the same

When the Spark barrier stage fails (a subtask's process died, a task raised, a peer vanished, an executor was lost
with its worker), the supervisor waits as its :mod:`restart strategy <spark_plugin.driver.restart>` says and opens a
new attempt with the coordinator, which aborts the pending checkpoints of the failed attempt and returns a verified
restore plan. The new attempt restores where the failed one left off (``AfterAttempt``): the newest checkpoint it
completed, else the checkpoint it restored, chosen by the coordinator as it opens the attempt, under the job's lock,
so a late acknowledgement of a killed task can neither complete a newer checkpoint behind the choice nor have
retention collect the chosen one first; the plan falls back past corrupt or missing blobs and says so. Each
:class:`Restart` records what the coordinator's attempt restored, as the attempts API says.

An executor the cluster lost is named (id, address, worker, Spark's reason) in the next attempt's reason. When the
restart needs more task slots than Spark offers (the lost worker is not replaced yet), the attempt opens saying so
in the job's status and waits up to ``slot_wait`` seconds for them; then the job is marked FAILED naming the lost
executors. When the strategy gives up, the job is marked FAILED with a message that says why, and
:class:`RestartsExhausted` is raised with that message and the checkpoint the job can resume from, read from the
coordinator once the job is FAILED (so no late acknowledgement can make it stale). Whenever the supervisor gives up
the job is FAILED, never left RUNNING.
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
from contract.models import AfterAttempt
from spark_plugin.api.errors import PipelineError
from spark_plugin.api.pipeline import PipelineDefinition
from spark_plugin.driver.autoscale import PressureJudge, PressureWatch, ScaleOnBackpressure, Scaling
from spark_plugin.driver.executors import active_ids, describe, lost_since
from spark_plugin.driver.restart import FixedDelay, RestartStrategy
from spark_plugin.driver.run import RunFailed, RunResult, SlotsNotBack, SlotWait, run_pipeline, task_slots
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


DEFAULT_SLOT_WAIT = 120.0
"""Seconds a restart waits, by default, for the task slots of a lost executor to come back."""


@dataclass
class Restart:
    """One restart: the attempt that failed and why (``error`` names a lost executor), how long the supervisor
    waited, and, once the next attempt opened, that attempt (``attempt``), the checkpoint the coordinator chose for it
    (``restore_from``: where the failed attempt left off) and the one it restored (``restored``, after
    ``fallbacks``): what the attempts API says of that attempt."""

    failed_attempt: int | None
    error: str
    delay: float
    restore_from: int | None = None
    restored: int | None = None
    fallbacks: list[dict] = field(default_factory=list)
    attempt: int | None = None


@dataclass
class SupervisedResult:
    """The last attempt's :class:`RunResult` (attribute access falls through to it) and the restart history."""

    result: RunResult
    restarts: list[Restart] = field(default_factory=list)
    scalings: list[Scaling] = field(default_factory=list)
    """The rescales ``scale_on_backpressure`` made, in order: the attempt stopped, the parallelism after, why."""

    def __getattr__(self, name: str) -> Any:
        if name in ("result", "restarts", "scalings"):
            raise AttributeError(name)
        return getattr(self.result, name)


class Supervisor:
    """Runs ``pipeline`` and restarts it after failures of its barrier stage, as ``restart`` says.

    With ``fit_to_slots`` (a :class:`~spark_plugin.driver.scaling.FitToSlots`), an attempt runs at the parallelism
    the slots Spark offers allow: after a lost executor the restart is scaled down from the latest completed
    checkpoint instead of failing or waiting, and once the slots are back the run is stopped and restarted at full
    parallelism from its latest completed checkpoint (that restart is not counted against ``restart``).

    A restart that finds fewer task slots than it needs waits for them up to ``slot_wait`` seconds (the attempt's
    reason, the job's status message, says so), then fails the job naming the executors lost.

    With ``scale_on_backpressure`` (a :class:`~spark_plugin.driver.autoscale.ScaleOnBackpressure`) a vertex whose
    input stays backpressured is scaled up while Spark has free slots, and back down once the pressure is gone: the
    run is stopped and restarted from its latest completed checkpoint at the new parallelism (not counted against
    ``restart``); each such attempt's reason says what was scaled and why.
    """

    def __init__(
        self,
        pipeline: PipelineDefinition,
        restart: RestartStrategy | None = None,
        sleep=time.sleep,
        fit_to_slots: FitToSlots | None = None,
        slots: Callable[[Any], int] = lambda spark: task_slots(spark.sparkContext),
        slot_wait: float = DEFAULT_SLOT_WAIT,
        scale_on_backpressure: ScaleOnBackpressure | None = None,
    ) -> None:
        if not 0 <= slot_wait < float("inf"):
            raise ValueError(f"slot_wait {slot_wait!r} must be a number of seconds, 0 or more")
        self.pipeline = pipeline
        self.restart = restart if restart is not None else FixedDelay()
        self.sleep = sleep
        self.fit_to_slots = fit_to_slots
        self.slots = slots
        self.slot_wait = slot_wait
        self.scale_on_backpressure = scale_on_backpressure
        self.restarts: list[Restart] = []
        self.scalings: list[Scaling] = []
        self._scaled: dict[str, int] | None = None  # the parallelism the pressure asked for (None: as defined)
        self._capacity: dict[str, float] = {}  # records/s one subtask of a vertex took while pressed

    def run(self, spark: Any, coordinator: str, **kwargs: Any) -> SupervisedResult:
        """Like :func:`~spark_plugin.driver.run.run_pipeline` (same arguments), with restarts."""
        kwargs.pop("fail_job_on_error", None)
        # the supervisor outlasts its subtasks: a coordinator outage that made them give up (their
        # max_coordinator_outage) is what it waits through before it restarts them, up to the default at least
        patience = max(kwargs.get("max_coordinator_outage", DEFAULT_MAX_OUTAGE), DEFAULT_MAX_OUTAGE)
        job_id: int | None = kwargs.pop("job_id", None)
        restore_from = kwargs.pop("restore_from", "latest")
        reason: str | None = kwargs.pop("attempt_reason", None)
        self.restarts, self.scalings, self._scaled, self._capacity = [], [], None, {}
        opening: Restart | None = None  # the restart whose attempt the next run opens
        failed: RunFailed | None = None  # the last failure, with what the cluster lost
        lost = ""
        while True:
            try:
                pipeline, scaled = self._fitted(spark)
            except PipelineError as pe:
                if failed is None:
                    raise  # nothing registered yet: nothing to mark FAILED
                # too few slots even for min_parallelism, for as long as FitToSlots waits: the job must not stay
                # RUNNING on an attempt that failed
                e = RunFailed(f"job {job_id}: {pe}" + (f" (lost {lost})" if lost else "") + f"; after {failed}",
                              job_id, failed.attempt, failed.restore_plan)
                with OvertakeClient(coordinator, kwargs.get("token")) as client:
                    raise self._give_up(client, e, len(self.restarts), patience, waited=True) from pe
            if scaled:
                reason = "; ".join(r for r in (reason, scaled) if r)
            group = f"overtake-{uuid.uuid4().hex[:12]}"
            watch = self._watch_slots(spark, group) if scaled else None
            pressure = self._watch_pressure(spark, pipeline, group, coordinator, kwargs.get("token"))
            before = active_ids(_context(spark))
            wait = None
            if job_id is not None and not _local(spark):
                # a cluster's slots come back with a replaced worker; local[N]'s never change: no use waiting there
                wait = SlotWait(self.slot_wait, lambda: self.slots(spark), lost, self.sleep)
            try:
                result = run_pipeline(
                    pipeline, spark, coordinator, job_id=job_id, restore_from=restore_from,
                    fail_job_on_error=False, attempt_reason=reason, job_group=group, wait_for_slots=wait,
                    on_attempt=pressure.attach if pressure is not None else None, **kwargs,
                )
            except RunFailed as e:
                if e.job_id is None:
                    raise
                job_id = e.job_id
                if opening is not None:
                    _note(opening, e.attempt, e.restore_plan)
                    opening = None
                if isinstance(e, SlotsNotBack):
                    with OvertakeClient(coordinator, kwargs.get("token")) as client:
                        raise self._give_up(client, e, len(self.restarts), patience, waited=True) from e
                _wait_for_tasks_to_end(spark)
                lost = describe(lost_since(_context(spark), before))
                failed = e
                error = f"{e}; lost {lost}" if lost else str(e)
                # the coordinator chooses, as the next attempt opens, where this one left off
                restore_from = AfterAttempt(e.attempt) if e.attempt is not None else restore_from
                if watch is not None and watch.fired:
                    # stopped on purpose: the slots for full parallelism are back
                    reason = f"scaled back to full parallelism where attempt {e.attempt} left off: the slots are back"
                    log.warning("job %s: %s", job_id, reason)
                    continue
                if pressure is not None and pressure.scaling is not None:
                    # stopped on purpose: the pressure asked for another parallelism
                    self.scalings.append(pressure.scaling)
                    self._scaled = pressure.scaling.target
                    reason = f"{pressure.scaling.reason}; where attempt {e.attempt} left off"
                    continue
                number = len(self.restarts) + 1
                delay = self.restart.delay_before(number)
                if delay is None:
                    with OvertakeClient(coordinator, kwargs.get("token")) as client:
                        raise self._give_up(client, e, number - 1, patience, error=error) from e
                log.warning("%s; restart %d in %.2fs where attempt %s left off", error, number, delay, e.attempt)
                opening = Restart(e.attempt, error, delay)
                self.restarts.append(opening)
                reason = f"restart {number} after: {error[:1500]}"
                self.sleep(delay)
                continue
            finally:
                if watch is not None:
                    watch.stop()
                if pressure is not None:
                    pressure.stop()
            if opening is not None:
                _note(opening, result.attempt, result.restore_plan)
            return SupervisedResult(result, list(self.restarts), list(self.scalings))

    def _fitted(self, spark: Any) -> tuple[PipelineDefinition, str | None]:
        """The pipeline at the parallelism the free slots allow, and what was changed (None: as defined), starting
        from the parallelism the pressure asked for, if it asked."""
        base = self._base()
        if self.fit_to_slots is None:
            return base, None
        plan = base.plan()
        slots = self._wait_for_slots(spark, plan)
        parallelism = fit(plan, slots, self.fit_to_slots.min_parallelism)
        full = {v.id: v.parallelism for v in plan.vertices}
        if parallelism == full:
            return self.pipeline, None
        changes = ", ".join(f"{vid} {full[vid]}->{p}" for vid, p in parallelism.items() if p != full[vid])
        said = f"scaled down to the {slots} task slots Spark offers ({plan.num_subtasks} wanted): {changes}"
        log.warning("pipeline %s %s", plan.name, said)
        return at_parallelism(base, plan, parallelism), said

    def _base(self) -> PipelineDefinition:
        """The pipeline as defined, or at the parallelism the last rescale on backpressure chose."""
        if self._scaled is None:
            return self.pipeline
        return at_parallelism(self.pipeline, self.pipeline.plan(), self._scaled)

    def _watch_pressure(
        self, spark: Any, pipeline: PipelineDefinition, group: str, coordinator: str, token: str | None
    ) -> PressureWatch | None:
        policy = self.scale_on_backpressure
        if policy is None:
            return None
        plan = pipeline.plan()
        defined = {v.id: v.parallelism for v in self.pipeline.plan().vertices}
        judge = PressureJudge(plan, defined, policy, self._capacity)

        def metrics(job_id: int) -> Any:
            with OvertakeClient(coordinator, token) as client:
                return client.live_metrics(job_id)

        return PressureWatch(
            judge, metrics, lambda: self.slots(spark) - plan.num_subtasks, policy.check_every,
            lambda: spark.sparkContext.cancelJobGroup(group),
        )

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
            lambda: self.slots(spark), self._base().plan().num_subtasks, self.fit_to_slots.check_every,
            lambda: spark.sparkContext.cancelJobGroup(group),
        )

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

    def _give_up(
        self, client: Any, e: RunFailed, restarts: int, patience: float, error: str | None = None, waited: bool = False
    ) -> RestartsExhausted:
        """Mark the job FAILED, then name the checkpoint it can resume from.

        In this order because the failed attempt's tasks may still be acknowledging while Spark kills them: once
        the job is FAILED its pending checkpoints are aborted and none of them can complete any more, so the
        checkpoint named is the coordinator's final word on the attempt. ``waited``: the wait for task slots gave
        up (``e`` says for what), not the restart strategy.
        """
        if waited:
            failure = f"{e}; gave up waiting for task slots"
        else:
            failure = f"{error or e}; gave up after {restarts} restart(s) as {self.restart!r} allows"
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


def _note(restart: Restart, attempt: int | None, plan: Any) -> None:
    """What the attempt a restart opened restored, from the coordinator's plan (what its attempts API says)."""
    restart.attempt = attempt
    if plan is not None:
        restart.restore_from = plan.requested_checkpoint
        restart.restored = plan.checkpoint_id
        restart.fallbacks = [fb.model_dump() for fb in plan.fallbacks]


def _context(spark: Any) -> Any:
    return getattr(spark, "sparkContext", None)


def _local(spark: Any) -> bool:
    return str(getattr(_context(spark), "master", "") or "").startswith("local")


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

