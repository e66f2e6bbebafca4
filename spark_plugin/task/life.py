"""The life of one subtask, written once for the Spark task and for the threads harness.

    build -> rewind -> restore -> listen -> connect -> run -> serve while the others run -> settle -> close

What differs between a Spark task and a thread is only how subtasks learn each other's addresses and how one knows
that every subtask of the run left its loop; both come in as arguments.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from contract.models import SubtaskRestore
from spark_plugin.network.config import NetworkConfig
from spark_plugin.network.connect import Listener, connect_inputs
from spark_plugin.plan.job import JobPlan
from spark_plugin.plan.topology import SubtaskSpec
from spark_plugin.task.chain import OperatorChain
from spark_plugin.task.coordination import DEFAULT_MAX_OUTAGE, CheckpointReporter, CoordinatorEvents
from spark_plugin.task.recovery import RecoveryProgress
from spark_plugin.task.restore import FetchBlob, RestoreStats, restore_subtask
from spark_plugin.task.state_store import StateWriter
from spark_plugin.task.subtask import Subtask, SubtaskResult

SERVE_AFTER_PEERS = 10.0
"""Seconds a subtask keeps answering triggers after every peer left its loop, before it settles."""

CLOSE_AFTER_FAILURE = 2.0
"""Seconds between a subtask's failure and the closing of its channels: its own error reaches Spark (or the threads
harness) first, before its peers fail because their channels to it broke."""


def build_subtask(
    plan: JobPlan,
    spec: SubtaskSpec,
    reporter: CheckpointReporter,
    events: CoordinatorEvents | None,
    network: NetworkConfig,
    attempt: int | None = None,
    deadline: float | None = None,
    stop_after_checkpoints: int | None = None,
    max_outage: float = DEFAULT_MAX_OUTAGE,
    state_writer: StateWriter | None = None,
) -> Subtask:
    """A subtask with its own copies of the chain's operators (as a Spark task would unpickle them)."""
    vertex = plan.vertex(spec.vertex)
    chain = OperatorChain.copy_of(vertex.operators)
    return Subtask(
        spec, chain, [out.edge.key_fn for out in spec.outputs], reporter, events, network, attempt=attempt,
        deadline=deadline, stop_after_checkpoints=stop_after_checkpoints,
        final_checkpoint=plan.commits_on_checkpoints, max_outage=max_outage,
        input_key_fns={e.source: e.key_fn for e in vertex.inputs if e.key_fn is not None},
        state_writer=state_writer,
    )


class SubtaskLife:
    """Takes one built subtask through its life."""

    def __init__(self, subtask: Subtask) -> None:
        self.subtask = subtask
        self.listener: Listener | None = None
        self.restore_stats: RestoreStats | None = None

    def prepare(
        self, job_id: int, checkpoint_id: int | None, part: SubtaskRestore | None, fetch: FetchBlob | None
    ) -> None:
        """Every attempt starts from ``checkpoint_id`` (None: from scratch): sinks withdraw output they committed
        past it (the attempt produces it again), then the subtask loads its ``part`` of the restore plan."""
        self.subtask.chain.rewind(job_id, checkpoint_id)
        if checkpoint_id is not None:
            if fetch is None:
                raise ValueError(f"{self.subtask.spec.name}: a restore needs a way to fetch its blobs")
            spec = self.subtask.spec
            part = part or SubtaskRestore(vertex=spec.vertex, subtask_index=spec.subtask_index)
            began = time.monotonic()
            self.restore_stats = restore_subtask(self.subtask, part, fetch, checkpoint_id)
            restore_ms = round((time.monotonic() - began) * 1000)
            st = self.subtask
            st.recovery = RecoveryProgress.after_restore(st.gate, st.partition, checkpoint_id, st.started_at, restore_ms)

    def listen(self, host: str) -> int:
        """Accept the downstream peers' connections on a port of ``host``; returns the port."""
        self.listener = Listener(host)
        self.listener.serve(self.subtask.partition.by_key)
        return self.listener.port

    def connect(self, addresses: dict[int, tuple[str, int]]) -> None:
        """Connect every input channel to its upstream subtask (``addresses``: position in the plan -> address)."""
        connect_inputs(self.subtask.gate, self.subtask.spec.inputs, addresses)

    def run(self) -> SubtaskResult:
        """The subtask's loop. A subtask that fails closes its channels and its event stream shortly after (in the
        background, ``CLOSE_AFTER_FAILURE`` seconds later, so that its error is the one reported first): its peers'
        channels then break and they fail too, instead of waiting for input or credit that never comes, and a
        reused Python worker keeps nothing of it."""
        try:
            return self.subtask.run()
        except BaseException:
            closing = threading.Timer(CLOSE_AFTER_FAILURE, self.close, kwargs={"timeout": 5.0})
            closing.name = f"close {self.subtask.spec.name}"
            closing.daemon = True
            closing.start()
            raise

    def end(self, result: SubtaskResult, wait_for_peers: Callable[[], Any]) -> SubtaskResult:
        """After the loop: keep answering checkpoints until every subtask of the run left its loop (closing channels
        earlier would break their input), let the sinks commit what the final checkpoint holds, then close."""
        st = self.subtask
        stop = threading.Event()
        serving = threading.Thread(target=st.serve_finished, args=(stop,), name="finished", daemon=True)
        serving.start()
        try:
            wait_for_peers()
        finally:
            stop.set()
            serving.join(SERVE_AFTER_PEERS)
        st.settle(result.status)  # sinks commit the output of the final checkpoint before the subtask ends
        st.close_operators(result)
        self.close()
        result.acked = list(st.ack_worker.acked)
        result.declined = list(st.ack_worker.declined)
        result.report_errors = list(st.ack_worker.errors)
        return result

    def close(self, timeout: float = 30.0) -> None:
        self.subtask.close(timeout)
        if self.listener is not None:
            self.listener.close()
