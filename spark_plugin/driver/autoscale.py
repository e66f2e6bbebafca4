"""Scaling a vertex up while its input stays backpressured, and back down once the pressure is gone (opt-in).

    pipeline.run(spark, url, restart=FixedDelay(3), scale_on_backpressure=ScaleOnBackpressure(max_parallelism=8))

A vertex is the job's bottleneck when the vertex feeding it spends most of its time blocked on output (its
backpressure, Flink's figure, averaged over its subtasks, at least ``high``) while the vertex itself is not blocked
(its most backpressured subtask below ``high``): it cannot take its input as fast as it comes. When that holds at
every look for ``stabilization`` seconds and Spark has free task slots, the supervisor stops the run and restarts it
from its latest checkpoint with that vertex (and the vertices a forward edge ties to it) at twice the parallelism,
bounded by ``max_parallelism``, the vertex's key groups and the free slots. The rate the vertex took while pressed,
divided by its parallelism, is what one of its subtasks can take (its capacity). Once the vertex takes less than
``utilization`` of the capacity of fewer subtasks for ``stabilization`` seconds, with nothing feeding it
backpressured, it is scaled back down to the fewest that keep that headroom, never below the pipeline's own
parallelism. Each rescale is an attempt of the job whose reason (the job's status message, the attempt's row and
its ``attempt.started`` event) says what was scaled and why; it is not counted as a restart.

Only the metrics of the running attempt count, and only once every subtask reports and none replays restored data
(a restore's replay is busier than the steady state), plus ``settle`` seconds for the rates to describe the new
parallelism.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contract.models import Partitioning
from spark_plugin.plan.job import JobPlan

log = logging.getLogger("overtake.autoscale")


@dataclass(frozen=True)
class ScaleOnBackpressure:
    """When and how far the supervisor rescales a vertex from its live metrics; see the module's text."""

    max_parallelism: int
    high: float = 0.5
    stabilization: float = 30.0
    utilization: float = 0.7
    check_every: float = 2.0
    settle: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_parallelism, int) or self.max_parallelism < 1:
            raise ValueError(f"max_parallelism {self.max_parallelism!r} must be a whole number of subtasks, 1 or more")
        if not 0 < self.high <= 1:
            raise ValueError(f"high {self.high!r} must be a share of time above 0 and at most 1")
        if not 0 < self.utilization <= 1:
            raise ValueError(f"utilization {self.utilization!r} must be a share above 0 and at most 1")
        for name in ("stabilization", "settle"):
            if not 0 <= getattr(self, name) < math.inf:
                raise ValueError(f"{name} {getattr(self, name)!r} must be a number of seconds, 0 or more")
        if not 0 < self.check_every < math.inf:
            raise ValueError(f"check_every {self.check_every!r} must be a positive number of seconds")


@dataclass(frozen=True)
class Scaling:
    """One rescale the pressure asked for: the parallelism of every vertex after it, and why."""

    target: dict[str, int]
    reason: str
    attempt: int | None = None
    """The attempt that was stopped for it (set by the supervisor)."""


def forward_group(plan: JobPlan, vertex: str) -> list[str]:
    """``vertex`` and every vertex a chain of forward edges ties to it (they keep equal parallelism)."""
    edges = [(e.source, e.target) for v in plan.vertices for e in v.outputs if e.partitioning == Partitioning.forward]
    group, grew = {vertex}, True
    while grew:
        grew = False
        for a, b in edges:
            if (a in group) != (b in group):
                group |= {a, b}
                grew = True
    order = [v.id for v in plan.vertices]
    return sorted(group, key=order.index)


@dataclass
class _Held:
    """A condition seen at every look since ``since``, with the samples taken meanwhile."""

    since: float
    rates: list[float] = field(default_factory=list)
    pressure: list[float] = field(default_factory=list)


class PressureJudge:
    """Decides, look by look, whether the run at ``current`` parallelism should be rescaled (pure: the clock and the
    metrics are passed in). ``defined`` is the pipeline's own parallelism, the floor of a scale-down; ``capacity``
    (records per second one subtask of a vertex took while pressed) is carried from the scale-ups before."""

    def __init__(
        self, plan: JobPlan, defined: dict[str, int], policy: ScaleOnBackpressure, capacity: dict[str, float]
    ) -> None:
        self.plan, self.defined, self.policy, self.capacity = plan, defined, policy, capacity
        self.current = {v.id: v.parallelism for v in plan.vertices}
        self.limit = {v.id: min(policy.max_parallelism, v.max_parallelism) for v in plan.vertices}
        self.upstream: dict[str, list[str]] = {v.id: [] for v in plan.vertices}
        for v in plan.vertices:
            for e in v.outputs:
                if e.source != e.target and e.source not in self.upstream[e.target]:
                    self.upstream[e.target].append(e.source)
        self.ready_since: float | None = None
        self.pressed: dict[str, _Held] = {}
        self.calm: dict[str, _Held] = {}
        self.said_no_slots: set[str] = set()

    def observe(self, now: float, metrics: Any, free_slots: int) -> Scaling | None:
        """One look: ``metrics`` is the job's live metrics (``JobLiveMetrics``) of the running attempt."""
        vertices = {v.vertex: v for v in metrics.vertices}
        ready = all(
            vid in vertices and vertices[vid].reporting >= p and not vertices[vid].replaying
            for vid, p in self.current.items()
        )
        if not ready:
            self.ready_since = None
            self.pressed.clear()
            self.calm.clear()
            return None
        if self.ready_since is None:
            self.ready_since = now
        if now - self.ready_since < self.policy.settle:
            return None
        return self._scale_up(now, vertices, free_slots) or self._scale_down(now, vertices)

    def _rescaled(self, group: list[str], parallelism: int) -> tuple[dict[str, int], str]:
        """The parallelism of every vertex with ``group`` at ``parallelism``, and the changes said ("v 1->2")."""
        target = dict(self.current)
        target.update({g: parallelism for g in group})
        return target, ", ".join(f"{g} {self.current[g]}->{parallelism}" for g in group)

    def _pressure_on(self, vid: str, vertices: dict[str, Any]) -> tuple[str | None, float]:
        """The upstream of ``vid`` backpressured the most (its subtasks' average) and that share."""
        best, share = None, 0.0
        for up in self.upstream[vid]:
            avg = vertices[up].backpressure_avg or 0.0
            if avg > share:
                best, share = up, avg
        return best, share

    def _scale_up(self, now: float, vertices: dict[str, Any], free_slots: int) -> Scaling | None:
        high = self.policy.high
        for v in self.plan.vertices:
            up, share = self._pressure_on(v.id, vertices)
            if up is None or share < high or (vertices[v.id].backpressure_max or 0.0) >= high:
                self.pressed.pop(v.id, None)
                continue
            held = self.pressed.setdefault(v.id, _Held(now))
            held.rates.append(vertices[v.id].records_in_per_second or 0.0)
            held.pressure.append(share)
            if now - held.since < self.policy.stabilization:
                continue
            group = forward_group(self.plan, v.id)
            p = self.current[v.id]
            want = min(2 * p, min(self.limit[g] for g in group))
            room = free_slots // len(group)
            target_p = min(want, p + room)
            if target_p <= p:
                if v.id not in self.said_no_slots:
                    self.said_no_slots.add(v.id)
                    why = "at its max_parallelism" if want <= p else f"Spark has {free_slots} free task slots"
                    log.warning("vertex %s is the bottleneck (its input from %s backpressured %.0f%%) but is not "
                                "scaled up: %s", v.id, up, 100 * share, why)
                continue
            rate = sum(held.rates) / len(held.rates)
            if rate > 0:
                self.capacity[v.id] = rate / p
            target, changes = self._rescaled(group, target_p)
            reason = (
                f"scaled up on backpressure: {changes}: its input from {up} was backpressured "
                f"{100 * sum(held.pressure) / len(held.pressure):.0f}% of the time (at least {100 * high:.0f}%) for "
                f"{now - held.since:.0f} s while {v.id} took {rate:.0f} records/s"
            )
            return Scaling(target, reason)
        return None

    def _scale_down(self, now: float, vertices: dict[str, Any]) -> Scaling | None:
        for v in self.plan.vertices:
            p, floor = self.current[v.id], self.defined[v.id]
            capacity = self.capacity.get(v.id)
            _, share = self._pressure_on(v.id, vertices)
            if p <= floor or not capacity or share >= self.policy.high:
                self.calm.pop(v.id, None)
                continue
            rate = vertices[v.id].records_in_per_second or 0.0
            need = max(floor, math.ceil(rate / (capacity * self.policy.utilization)))
            if need >= p:
                self.calm.pop(v.id, None)
                continue
            held = self.calm.setdefault(v.id, _Held(now))
            held.rates.append(rate)
            if now - held.since < self.policy.stabilization:
                continue
            peak = max(held.rates)  # the busiest look of the window decides: a scale-down must not press again
            group = forward_group(self.plan, v.id)
            target_p = max(max(self.defined[g] for g in group),
                           math.ceil(peak / (capacity * self.policy.utilization)))
            if target_p >= p:
                held.rates.clear()
                held.since = now
                continue
            target, changes = self._rescaled(group, target_p)
            reason = (
                f"scaled down, the pressure gone: {changes}: {v.id} took at most {peak:.0f} records/s for "
                f"{now - held.since:.0f} s, within {100 * self.policy.utilization:.0f}% of what {target_p} "
                f"subtask(s) took when pressed ({capacity:.0f} records/s each)"
            )
            return Scaling(target, reason)
        return None


class PressureWatch:
    """Looks at the running attempt's live metrics every ``every`` seconds and, when ``judge`` decides, keeps the
    decision (``scaling``) and calls ``stop_run`` once (the supervisor restarts the job at the new parallelism).

    ``metrics(job_id)`` reads the job's live metrics; the watch knows the job and attempt once :meth:`attach` is
    called (the run opened its attempt). A coordinator that does not answer is skipped, not fatal: the run goes on.
    """

    def __init__(
        self,
        judge: PressureJudge,
        metrics: Callable[[int], Any],
        free_slots: Callable[[], int],
        every: float,
        stop_run: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.judge, self.metrics, self.free_slots, self.every = judge, metrics, free_slots, every
        self.stop_run, self.clock = stop_run, clock
        self.job_id: int | None = None
        self.attempt: int | None = None
        self.scaling: Scaling | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="pressure-watch", daemon=True)
        self._thread.start()

    def attach(self, job_id: int, attempt: int) -> None:
        self.job_id, self.attempt = job_id, attempt

    def _look(self) -> Scaling | None:
        if self.job_id is None:
            return None
        try:
            live = self.metrics(self.job_id)
        except Exception as e:  # noqa: BLE001 - a coordinator outage: the run's own tasks deal with it
            log.debug("live metrics of job %s not read: %s", self.job_id, e)
            return None
        if live.attempt != self.attempt:
            return None
        return self.judge.observe(self.clock(), live, self.free_slots())

    def _watch(self) -> None:
        while not self._done.wait(self.every):
            scaling = self._look()
            if scaling is not None:
                self.scaling = Scaling(scaling.target, scaling.reason, self.attempt)
                log.warning("job %s attempt %s: %s", self.job_id, self.attempt, scaling.reason)
                self.stop_run()
                return

    def stop(self) -> None:
        self._done.set()
        self._thread.join(self.every + 5)
