"""``Pipeline``: a pipeline's definition (``spark_plugin.api``) that runs on Spark from the driver (``run``)."""

from __future__ import annotations

from typing import Any

from spark_plugin.api.pipeline import PipelineDefinition
from spark_plugin.driver.autoscale import ScaleOnBackpressure
from spark_plugin.driver.restart import RestartStrategy
from spark_plugin.driver.run import RunResult, run_pipeline
from spark_plugin.driver.scaling import FitToSlots
from spark_plugin.driver.supervisor import DEFAULT_SLOT_WAIT, SupervisedResult, Supervisor


class Pipeline(PipelineDefinition):
    """A streaming pipeline: define it with ``source(...)`` and the stream methods, then ``run`` it."""

    def run(
        self,
        spark: Any,
        coordinator: str,
        *,
        restart: RestartStrategy | None = None,
        fit_to_slots: FitToSlots | None = None,
        slot_wait: float = DEFAULT_SLOT_WAIT,
        scale_on_backpressure: ScaleOnBackpressure | None = None,
        **kwargs: Any,
    ) -> RunResult | SupervisedResult:
        """Run on Spark as one barrier stage; see :func:`spark_plugin.driver.run.run_pipeline` for the arguments.

        With ``restart=`` (a strategy such as ``FixedDelay(max_restarts=3)``) a
        :class:`~spark_plugin.driver.supervisor.Supervisor` restarts a failed barrier stage from the latest
        checkpoint; with ``fit_to_slots=FitToSlots(min_parallelism=...)`` it also runs at the parallelism the slots
        Spark offers allow (after a lost executor) and scales back up when they return. A restart that needs more
        task slots than Spark offers waits up to ``slot_wait`` seconds for them, then fails the job naming the
        executors lost. With ``scale_on_backpressure=ScaleOnBackpressure(max_parallelism=...)`` a vertex whose input
        stays backpressured is scaled up while Spark has free slots, and back down once the pressure is gone
        (:mod:`spark_plugin.driver.autoscale`).
        """
        if restart is not None or fit_to_slots is not None or scale_on_backpressure is not None:
            return Supervisor(
                self, restart, fit_to_slots=fit_to_slots, slot_wait=slot_wait,
                scale_on_backpressure=scale_on_backpressure,
            ).run(spark, coordinator, **kwargs)
        return run_pipeline(self, spark, coordinator, **kwargs)
