"""Fitting a pipeline to the slots Spark offers: when a cluster lost executors the supervisor restarts the pipeline at
a lower parallelism from the latest completed checkpoint instead of failing or waiting, and scales it back up from a
later checkpoint once the slots return (an option of the supervisor, off by default).

    pipeline.run(spark, url, restart=FixedDelay(5), fit_to_slots=FitToSlots(min_parallelism=1))
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass

from contract.models import Partitioning
from spark_plugin.api.errors import PipelineError
from spark_plugin.api.pipeline import PipelineDefinition
from spark_plugin.plan.job import JobPlan


@dataclass(frozen=True)
class FitToSlots:
    """Run at the parallelism the cluster's free slots allow, down to ``min_parallelism`` per vertex; while scaled
    down, look every ``check_every`` seconds whether the slots for the full parallelism are back.

    Before each attempt the supervisor waits up to ``stabilization`` seconds for the slots of the full parallelism
    (executors register one by one after a start, and a replaced worker comes back), then up to ``resource_wait``
    seconds for the slots of ``min_parallelism`` (Flink's adaptive scheduler has the same two waits); past that the
    run fails, saying how many slots it needs and how many Spark offers.
    """

    min_parallelism: int = 1
    check_every: float = 5.0
    stabilization: float = 10.0
    resource_wait: float = 300.0

    def __post_init__(self) -> None:
        if self.min_parallelism < 1:
            raise ValueError(f"min_parallelism {self.min_parallelism} must be at least 1")
        if self.check_every <= 0:
            raise ValueError(f"check_every {self.check_every} must be positive (seconds)")
        if self.stabilization < 0 or self.resource_wait < 0:
            raise ValueError(
                f"stabilization {self.stabilization} and resource_wait {self.resource_wait} must not be negative"
            )


def floor_slots(plan: JobPlan, min_parallelism: int) -> int:
    """The task slots the plan needs at ``min_parallelism`` (vertices defined below it keep theirs)."""
    return sum(min(v.parallelism, min_parallelism) for v in plan.vertices)


def _forward_groups(plan: JobPlan) -> list[list[str]]:
    """Vertices that forward edges tie together (they must keep equal parallelism), each group once."""
    group_of = {v.id: {v.id} for v in plan.vertices}
    for v in plan.vertices:
        for e in v.outputs:
            if e.partitioning == Partitioning.forward:
                merged = group_of[e.source] | group_of[e.target]
                for vid in merged:
                    group_of[vid] = merged
    seen: list[set[str]] = []
    for g in group_of.values():
        if not any(g is s for s in seen):
            seen.append(g)
    order = [v.id for v in plan.vertices]
    return [sorted(g, key=order.index) for g in seen]


def fit(plan: JobPlan, slots: int, min_parallelism: int = 1) -> dict[str, int]:
    """Parallelism per vertex that needs at most ``slots`` subtasks: every vertex scaled by the same factor, then
    the largest groups lowered one by one until it fits; the plan's own parallelism when it fits already.

    Raises :class:`PipelineError` when even ``min_parallelism`` everywhere does not fit.
    """
    full = {v.id: v.parallelism for v in plan.vertices}
    if sum(full.values()) <= slots:
        return full
    floor = {vid: min(p, min_parallelism) for vid, p in full.items()}
    if sum(floor.values()) > slots:
        raise PipelineError(
            f"pipeline {plan.name!r} needs at least {sum(floor.values())} task slots at min_parallelism "
            f"{min_parallelism}, but Spark offers {slots}; wait for executors, or lower min_parallelism"
        )
    factor = slots / sum(full.values())
    groups = _forward_groups(plan)
    scaled = {}
    for g in groups:
        p = max(floor[g[0]], min(full[g[0]], int(full[g[0]] * factor)))
        scaled.update({vid: p for vid in g})
    while sum(scaled.values()) > slots:
        lowerable = [g for g in groups if scaled[g[0]] > floor[g[0]]]
        g = max(lowerable, key=lambda g: (scaled[g[0]], len(g)))
        scaled.update({vid: scaled[vid] - 1 for vid in g})
    # Rounding down leaves slots idle (two vertices of 4 on 7 slots: 3 and 3): raise the groups furthest below their
    # full parallelism, one subtask at a time, while a raise still fits.
    while True:
        free = slots - sum(scaled.values())
        raisable = [g for g in groups if scaled[g[0]] < full[g[0]] and len(g) <= free]
        if not raisable:
            return scaled
        g = min(raisable, key=lambda g: (scaled[g[0]] / full[g[0]], -full[g[0]], groups.index(g)))
        scaled.update({vid: scaled[vid] + 1 for vid in g})


def at_parallelism(pipeline: PipelineDefinition, plan: JobPlan, parallelism: dict[str, int]) -> PipelineDefinition:
    """A copy of the definition whose job vertices run with ``parallelism`` (vertex id -> subtasks)."""
    scaled = copy.deepcopy(pipeline)
    op_vertex = {op.id: v.id for v in plan.vertices for op in v.operators}
    for node in scaled.nodes:
        node.op.parallelism = parallelism[op_vertex[node.op.id]]
    return scaled


class SlotWatch:
    """While a scaled-down run goes on, look every ``every`` seconds whether ``slots()`` reached ``wanted``; then
    call ``stop_run`` once (the supervisor restarts the pipeline at full parallelism from a later checkpoint)."""

    def __init__(self, slots: Callable[[], int], wanted: int, every: float, stop_run: Callable[[], None]) -> None:
        self.slots, self.wanted, self.every, self.stop_run = slots, wanted, every, stop_run
        self.fired = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="slot-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(self.every):
            if self.slots() >= self.wanted:
                self.fired = True
                self.stop_run()
                return

    def stop(self) -> None:
        self._done.set()
        self._thread.join(self.every + 1)
