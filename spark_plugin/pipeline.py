"""``Pipeline``: a pipeline's definition (``spark_plugin.api``) that runs on Spark from the driver (``run``)."""

from __future__ import annotations

from typing import Any

from spark_plugin.api.pipeline import PipelineDefinition
from spark_plugin.driver.restart import RestartStrategy
from spark_plugin.driver.run import RunResult, run_pipeline
from spark_plugin.driver.scaling import FitToSlots
from spark_plugin.driver.supervisor import SupervisedResult, Supervisor


class Pipeline(PipelineDefinition):
    """A streaming pipeline: define it with ``source(...)`` and the stream methods, then ``run`` it."""

    def run(
        self,
        spark: Any,
        coordinator: str,
        *,
        restart: RestartStrategy | None = None,
        fit_to_slots: FitToSlots | None = None,
        **kwargs: Any,
    ) -> RunResult | SupervisedResult:
        """Run on Spark as one barrier stage; see :func:`spark_plugin.driver.run.run_pipeline` for the arguments.

        With ``restart=`` (a strategy such as ``FixedDelay(max_restarts=3)``) a
        :class:`~spark_plugin.driver.supervisor.Supervisor` restarts a failed barrier stage from the latest
        checkpoint; with ``fit_to_slots=FitToSlots(min_parallelism=...)`` it also runs at the parallelism the slots
        Spark offers allow (after a lost executor) and scales back up when they return.
        """
        if restart is not None or fit_to_slots is not None:
            return Supervisor(self, restart, fit_to_slots=fit_to_slots).run(spark, coordinator, **kwargs)
        return run_pipeline(self, spark, coordinator, **kwargs)
