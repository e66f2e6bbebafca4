"""Runs every subtask of a pipeline as threads of this process over real sockets (tests and debugging, no Spark).

Each subtask goes through the same life as in a Spark task (``spark_plugin.task.life``); only the address exchange
and the meeting point after the loops differ.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from contract.models import SubtaskRestore
from spark_plugin.api.pipeline import PipelineDefinition
from spark_plugin.network.config import NetworkConfig
from spark_plugin.plan.topology import SubtaskSpec, subtask_specs
from spark_plugin.task.coordination import CheckpointReporter, CoordinatorEvents
from spark_plugin.task.life import SubtaskLife, build_subtask
from spark_plugin.task.restore import FetchBlob
from spark_plugin.task.state_store import StateWriter
from spark_plugin.task.subtask import Subtask, SubtaskResult


class ThreadedRun:
    """Every subtask in its own thread; ``start`` connects them, ``join`` returns their results."""

    def __init__(
        self,
        pipeline: PipelineDefinition,
        reporter_for: Callable[[SubtaskSpec], CheckpointReporter],
        events_for: Callable[[SubtaskSpec], CoordinatorEvents | None],
        network: NetworkConfig | None = None,
        deadline: float | None = None,
        restore: Mapping[tuple[str, int], SubtaskRestore | dict[str, Any]] | None = None,
        fetch: FetchBlob | None = None,
        restore_checkpoint: int | None = None,
        job_id: int = 0,
        state_writer_for: Callable[[SubtaskSpec], StateWriter | None] | None = None,
    ) -> None:
        """``restore``: each subtask's part of a restore plan, by (vertex, subtask index), as a ``SubtaskRestore`` or
        as its JSON without the vertex and index (as tests write plans). ``state_writer_for``: each subtask's writer
        into the blob store (its checkpoints' triggers then carry write targets); without one, state goes through
        the reporter."""
        self.plan = pipeline.plan()
        self.specs = subtask_specs(self.plan)
        network = network or NetworkConfig()
        self.lives = [
            SubtaskLife(
                build_subtask(
                    self.plan, s, reporter_for(s), events_for(s), network, deadline=deadline,
                    state_writer=state_writer_for(s) if state_writer_for is not None else None,
                )
            )
            for s in self.specs
        ]
        for life in self.lives:
            spec = life.subtask.spec
            part = (restore or {}).get((spec.vertex, spec.subtask_index))
            life.prepare(job_id, restore_checkpoint, _typed(part, spec), fetch)
        self.results: dict[int, SubtaskResult] = {}
        self.errors: dict[int, BaseException] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._loops_left = 0
        self._all_left = threading.Event()

    @property
    def subtasks(self) -> list[Subtask]:
        return [life.subtask for life in self.lives]

    def subtask(self, vertex: str, index: int) -> Subtask:
        for s in self.subtasks:
            if s.spec.vertex == vertex and s.spec.subtask_index == index:
                return s
        raise KeyError((vertex, index))

    def start(self) -> ThreadedRun:
        addresses = {i: ("127.0.0.1", life.listen("127.0.0.1")) for i, life in enumerate(self.lives)}
        for life in self.lives:
            life.connect(addresses)
        for i, life in enumerate(self.lives):
            t = threading.Thread(target=self._run, args=(i, life), name=f"subtask {life.subtask.spec.name}")
            t.daemon = True
            self._threads.append(t)
            t.start()
        return self

    def finished(self) -> bool:
        """Whether every subtask's thread has ended (a checkpoint triggered now is answered by none)."""
        return bool(self._threads) and not any(t.is_alive() for t in self._threads)

    def _left_loop(self) -> None:
        with self._lock:
            self._loops_left += 1
            if self._loops_left == len(self.lives):
                self._all_left.set()

    def _run(self, i: int, life: SubtaskLife) -> None:
        try:
            result = life.run()
        except BaseException as e:  # noqa: BLE001 - reported by join
            self.errors[i] = e
            self._left_loop()
            return
        self._left_loop()
        try:
            self.results[i] = life.end(result, wait_for_peers=self._all_left.wait)
        except BaseException as e:  # noqa: BLE001 - reported by join
            self.errors[i] = e

    def join(self, timeout: float = 60.0) -> list[SubtaskResult]:
        for t in self._threads:
            t.join(timeout)
        alive = [t.name for t in self._threads if t.is_alive()]
        for life in self.lives:
            life.close(5)
        if alive:
            raise TimeoutError(f"subtasks still running after {timeout}s: {alive}")
        if self.errors:
            raise next(iter(self.errors.values()))
        return [self.results[i] for i in range(len(self.lives))]


def _typed(part: SubtaskRestore | dict[str, Any] | None, spec: SubtaskSpec) -> SubtaskRestore | None:
    """A subtask's part of a restore plan as the model the runtime takes (validated when given as JSON)."""
    if part is None or isinstance(part, SubtaskRestore):
        return part
    return SubtaskRestore.model_validate({"vertex": spec.vertex, "subtask_index": spec.subtask_index, **part})
