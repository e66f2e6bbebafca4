"""The rescale soak's coordinator, in memory: blobs, acks, completion and events of one run (``MemoryCoordinator``),
and the restore plan the real coordinator makes from a checkpoint's acks (``coordinator_plan``)."""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from typing import Any


def coordinator_plan(plan: Any, acks: dict[tuple[str, int], dict], blobs: dict[str, bytes], checkpoint_id: int):
    """The restore plan the coordinator makes for ``plan`` (the job graph at its new parallelism) from checkpoint
    ``checkpoint_id``'s acks: each ack recorded as the coordinator records it (``app.domain.ack_recording.ack_row``), then its
    planner (``app.domain.restore._plan``); blobs are the fake coordinator's, by id. Returns the plan and each
    subtask's part as the driver hands it to the subtask (``model_dump(mode="json")``)."""
    from app.db.models import AckRow, CheckpointRow, JobRow
    from app.domain.ack_recording import ack_row
    from app.domain.restore import _plan
    from contract.models import SubtaskAck

    job = JobRow(id=1, graph=plan.graph().model_dump(mode="json"))
    rows = []
    for (vertex, index), ack in sorted(acks.items()):
        a = SubtaskAck.model_validate({**ack, "vertex": vertex, "subtask_index": index, "attempt": 1})
        rows.append(AckRow(**ack_row(1, checkpoint_id, a, "0" * 64, 0, 0)))
    used = {b for a in rows for b in (a.operator_blob_id, a.channel_blob_id) if b}
    blob_rows = {
        b: type("Blob", (), {"id": b, "sha256": hashlib.sha256(blobs[b]).hexdigest(), "size": len(blobs[b])})
        for b in used
    }
    restore_plan = _plan(job, CheckpointRow(id=checkpoint_id, is_savepoint=False), rows, blob_rows, checkpoint_id, [])
    parts = {(s.vertex, s.subtask_index): s.model_dump(mode="json") for s in restore_plan.subtasks}
    return restore_plan, parts


class MemoryCoordinator:
    """The coordinator of one run, in memory (as ``tests/spark_plugin/fakes.InMemoryCoordinator``): stores blobs and
    acks, completes a checkpoint once every subtask acked it, aborts it at the first decline, and broadcasts events
    to every subtask."""

    def __init__(self, expected_subtasks: int) -> None:
        self.expected_subtasks = expected_subtasks
        self.lock = threading.Lock()
        self.blobs: dict[str, bytes] = {}
        self.acks: dict[int, dict[tuple[str, int], dict]] = {}
        self.completed: list[int] = []
        self.aborted: set[int] = set()
        self.declines: list[tuple[int, str, int, str]] = []
        self.streams: list[_Events] = []
        self.running: set[tuple[str, int]] = set()
        """Subtasks that reported running (a restored one once its replay is through)."""

    def reporter(self, spec: Any) -> _Reporter:
        return _Reporter(self, spec.vertex, spec.subtask_index)

    def events(self, spec: Any) -> _Events:
        stream = _Events()
        with self.lock:
            self.streams.append(stream)
        return stream

    def publish(self, payload: Any) -> None:
        with self.lock:
            streams = list(self.streams)
        for s in streams:
            s.queue.put(payload)

    def trigger(self, checkpoint_id: int, policy: str = "unaligned", **more: Any) -> None:
        from contract.events import CheckpointTriggered

        self.publish(CheckpointTriggered(checkpoint_id=checkpoint_id, attempt=None, policy=policy,
                                         alignment_timeout=None, trigger_timestamp=int(time.time() * 1000), **more))

    def settled(self, checkpoint_id: int) -> bool:
        return checkpoint_id in self.completed or checkpoint_id in self.aborted


class _Reporter:
    def __init__(self, coord: MemoryCoordinator, vertex: str, index: int) -> None:
        self.coord, self.vertex, self.index = coord, vertex, index

    def _store(self, checkpoint_id: int, kind: str, data: bytes) -> dict:
        # a 32-hex id, as the coordinator gives its blobs
        blob_id = hashlib.md5(f"{checkpoint_id}-{self.vertex}-{self.index}-{kind}".encode()).hexdigest()
        with self.coord.lock:
            self.coord.blobs[blob_id] = data
        return {"blob_id": blob_id, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}

    def ack(self, checkpoint_id: int, ack: dict) -> None:
        self.ack_with_state(checkpoint_id, ack, None, None)

    def ack_with_state(self, checkpoint_id: int, ack: dict, operator_state: bytes | None,
                       channel_state: bytes | None) -> None:
        from contract.events import CheckpointCompleted

        ack = dict(ack)
        if operator_state is not None:
            ack["operator_state"] = self._store(checkpoint_id, "operator", operator_state)
        if channel_state is not None:
            ack["channel_state"] = self._store(checkpoint_id, "channel", channel_state)
        c = self.coord
        with c.lock:
            acks = c.acks.setdefault(checkpoint_id, {})
            acks[(self.vertex, self.index)] = ack
            done = len(acks) == c.expected_subtasks and checkpoint_id not in c.aborted
            if done:
                c.completed.append(checkpoint_id)
        if done:
            c.publish(CheckpointCompleted(checkpoint_id=checkpoint_id, attempt=None))

    def decline(self, checkpoint_id: int, reason: str) -> None:
        from contract.events import CheckpointAborted

        c = self.coord
        with c.lock:
            c.declines.append((checkpoint_id, self.vertex, self.index, reason))
            first = checkpoint_id not in c.aborted and checkpoint_id not in c.completed
            c.aborted.add(checkpoint_id)
        if first:
            c.publish(CheckpointAborted(checkpoint_id=checkpoint_id, attempt=None, reason=reason))

    def request_checkpoint(self) -> None:
        pass  # the soak triggers its checkpoints itself

    def report_running(self) -> None:
        with self.coord.lock:
            self.coord.running.add((self.vertex, self.index))


class _Events:
    def __init__(self) -> None:
        self.queue: queue.Queue = queue.Queue()

    def __iter__(self):
        while True:
            item = self.queue.get()
            if item is None:
                return
            yield item

    def close(self) -> None:
        self.queue.put(None)
