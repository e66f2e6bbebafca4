"""Runs every subtask of a plan as threads of this process over real sockets (tests and debugging, no Spark)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from spark_plugin.config import NetworkConfig
from spark_plugin.connect import Listener, connect_inputs
from spark_plugin.coordination import CheckpointReporter, CoordinatorEvents
from spark_plugin.pipeline import Pipeline
from spark_plugin.restore import FetchBlob, restore_subtask
from spark_plugin.subtask import Subtask, SubtaskResult
from spark_plugin.tasks import build_subtask
from spark_plugin.topology import TaskSpec, task_specs


class ThreadedRun:
    """Every subtask in its own thread; ``start`` connects them, ``join`` returns their results."""

    def __init__(
        self,
        pipeline: Pipeline,
        reporter_for: Callable[[TaskSpec], CheckpointReporter],
        events_for: Callable[[TaskSpec], CoordinatorEvents | None],
        network: NetworkConfig | None = None,
        deadline: float | None = None,
        restore: dict[tuple[str, int], dict] | None = None,
        fetch: FetchBlob | None = None,
        restore_checkpoint: int | None = None,
        job_id: int = 0,
    ) -> None:
        self.plan = pipeline.plan()
        self.specs = task_specs(self.plan)
        network = network or NetworkConfig()
        self.subtasks: list[Subtask] = [
            build_subtask(self.plan, s, reporter_for(s), events_for(s), network, deadline=deadline)
            for s in self.specs
        ]
        for st in self.subtasks:
            st.rewind(job_id, restore_checkpoint)  # as every attempt does: sinks withdraw what is produced again
            part = (restore or {}).get((st.spec.vertex, st.spec.subtask_index))
            if part is not None:
                assert fetch is not None, "a restore needs a blob fetcher"
                restore_subtask(st, part, fetch, restore_checkpoint)
        self.results: dict[int, SubtaskResult] = {}
        self.errors: dict[int, BaseException] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._all_done = threading.Event()

    def subtask(self, vertex: str, index: int) -> Subtask:
        for s in self.subtasks:
            if s.spec.vertex == vertex and s.spec.subtask_index == index:
                return s
        raise KeyError((vertex, index))

    def start(self) -> ThreadedRun:
        listeners = [Listener("127.0.0.1") for _ in self.subtasks]
        addresses = {i: ("127.0.0.1", lst.port) for i, lst in enumerate(listeners)}
        for lst, st in zip(listeners, self.subtasks, strict=False):
            lst.serve(st)
        for st in self.subtasks:
            connect_inputs(st, addresses)
        for i, st in enumerate(self.subtasks):
            t = threading.Thread(target=self._run, args=(i, st), name=f"subtask {st.spec.vertex}[{st.spec.subtask_index}]")
            t.daemon = True
            self._threads.append(t)
            t.start()
        return self

    def _run(self, i: int, st: Subtask) -> None:
        try:
            self.results[i] = st.run()
        except BaseException as e:  # noqa: BLE001 - reported by join
            self.errors[i] = e
        with self._lock:
            if len(self.results) + len(self.errors) == len(self.subtasks):
                self._all_done.set()
        if i in self.results:
            st.serve_finished(self._all_done)
            try:
                st.settle(self.results[i].status)
            except BaseException as e:  # noqa: BLE001 - reported by join
                self.errors[i] = e
            st.close_operators(self.results[i])

    def join(self, timeout: float = 60.0) -> list[SubtaskResult]:
        for t in self._threads:
            t.join(timeout)
        alive = [t.name for t in self._threads if t.is_alive()]
        for st in self.subtasks:
            st.close(5)
        if alive:
            raise TimeoutError(f"subtasks still running after {timeout}s: {alive}")
        if self.errors:
            raise next(iter(self.errors.values()))
        return [self.results[i] for i in range(len(self.subtasks))]
