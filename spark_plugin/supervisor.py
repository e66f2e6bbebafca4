"""The driver-side supervisor: runs a pipeline's attempts and restarts a failed barrier stage.

    result = Supervisor(pipeline, restart=FixedDelay(max_restarts=3, delay=1.0)).run(spark, coordinator=url)
    result = pipeline.run(spark, url, restart=ExponentialBackoff(initial=0.5, max_delay=30))   # the same

When the Spark barrier stage fails (a subtask's process died, a task raised, a peer vanished), the supervisor
waits as its :mod:`restart strategy <spark_plugin.restart>` says and opens a new attempt with the coordinator,
which aborts the pending checkpoints of the failed attempt and returns a verified restore plan. First it waits
until Spark has killed the failed stage's remaining tasks, so no late ack of the old attempt completes a checkpoint
behind its back. The new attempt restores the newest checkpoint completed by the failed attempt (or, when it
completed none, the checkpoint the failed attempt itself restored), falling back past corrupt or missing blobs as
the plan says. When the strategy
gives up, the job is marked FAILED with a message that says why and which checkpoint it can resume from, and
:class:`RestartsExhausted` is raised with the same message.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from spark_plugin.execution import RunFailed, RunResult, run_pipeline
from spark_plugin.pipeline import Pipeline
from spark_plugin.restart import FixedDelay, RestartStrategy

log = logging.getLogger("overtake.supervisor")


class RestartsExhausted(RunFailed):
    """The restart strategy gave up; the message names the last failure and the checkpoint to resume from."""

    def __init__(self, message: str, job_id: int | None, attempt: int | None, resume_from: int | None) -> None:
        super().__init__(message, job_id, attempt)
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
    """Runs ``pipeline`` and restarts it after failures of its barrier stage, as ``restart`` says."""

    def __init__(self, pipeline: Pipeline, restart: RestartStrategy | None = None, sleep=time.sleep) -> None:
        self.pipeline = pipeline
        self.restart = restart if restart is not None else FixedDelay()
        self.sleep = sleep
        self.restarts: list[Restart] = []

    def run(self, spark: Any, coordinator: str, **kwargs: Any) -> SupervisedResult:
        """Like :func:`~spark_plugin.execution.run_pipeline` (same arguments), with restarts."""
        from client.sync import OvertakeClient

        kwargs.pop("fail_job_on_error", None)
        job_id: int | None = kwargs.pop("job_id", None)
        restore_from = kwargs.pop("restore_from", "latest")
        self.restarts = []
        while True:
            try:
                result = run_pipeline(
                    self.pipeline, spark, coordinator, job_id=job_id, restore_from=restore_from,
                    fail_job_on_error=False, **kwargs,
                )
            except RunFailed as e:
                if e.job_id is None:
                    raise
                job_id = e.job_id
                if self.restarts:
                    self._note_restored(e.restore_plan)
                _wait_for_tasks_to_end(spark)
                with OvertakeClient(coordinator, kwargs.get("token")) as client:
                    resume = self._resume_point(client, job_id, e.attempt, e.restore_plan)
                    number = len(self.restarts) + 1
                    delay = self.restart.delay_before(number)
                    if delay is None:
                        message = self._give_up_message(e, number - 1, resume)
                        try:
                            client.finish_job(job_id, "FAILED", message, attempt=e.attempt)
                        except Exception as fe:  # noqa: BLE001 - the failure is reported by the raise below
                            log.warning("could not mark job %s FAILED: %s", job_id, fe)
                        raise RestartsExhausted(message, job_id, e.attempt, resume) from e
                log.warning("%s; restart %d in %.2fs from %s", e, number, delay,
                            f"checkpoint {resume}" if resume is not None else "the beginning")
                self.restarts.append(Restart(e.attempt, str(e), delay, resume))
                self.sleep(delay)
                restore_from = resume
                continue
            if self.restarts:
                self._note_restored(result.restore_plan)
            return SupervisedResult(result, list(self.restarts))

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

    def _give_up_message(self, e: RunFailed, restarts: int, resume: int | None) -> str:
        where = (
            f"it can resume from checkpoint {resume} (run it with job_id={e.job_id}, restore_from={resume})"
            if resume is not None
            else "no checkpoint completed, so a new attempt would start from the beginning"
        )
        return f"{e}; gave up after {restarts} restart(s) as {self.restart!r} allows; {where}"


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

