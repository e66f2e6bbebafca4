"""In-memory stand-ins for tests without Spark: a recording BarrierActions and a coordinator fake."""

from __future__ import annotations

from spark_plugin.barriers import CheckpointBarrier


class RecordingActions:
    """Records every action a barrier state asks for, as ``(name, args...)`` tuples."""

    def __init__(self, now: int = 1_000) -> None:
        self.calls: list[tuple] = []
        self.now = now

    def snapshot(self, barrier: CheckpointBarrier, unaligned: bool, first_barrier_ms: int) -> None:
        self.calls.append(("snapshot", barrier.checkpoint_id, unaligned))

    def forward_barrier(self, barrier: CheckpointBarrier, priority: bool) -> None:
        self.calls.append(("forward", barrier.checkpoint_id, priority))

    def block(self, channel: int) -> None:
        self.calls.append(("block", channel))

    def unblock_all(self) -> None:
        self.calls.append(("unblock_all",))

    def start_recording(self, channel: int, checkpoint_id: int) -> None:
        self.calls.append(("record", channel, checkpoint_id))

    def stop_recording(self, channel: int) -> None:
        self.calls.append(("stop_record", channel))

    def finish_input(self, checkpoint_id: int, last_barrier_ms: int) -> None:
        self.calls.append(("finish_input", checkpoint_id))

    def abort(self, checkpoint_id: int, reason: str) -> None:
        self.calls.append(("abort", checkpoint_id, reason))

    def now_ms(self) -> int:
        return self.now

    def take(self) -> list[tuple]:
        out, self.calls = self.calls, []
        return out


class InMemoryCoordinator:
    """A coordinator fake for threaded runs: stores blobs and acks, broadcasts events to every subtask."""

    def __init__(self, expected_subtasks: int | None = None, policy: str = "unaligned") -> None:
        """With ``expected_subtasks`` it completes a checkpoint once that many acks arrived, and answers
        checkpoint requests by triggering the next id with ``policy``."""
        import queue
        import threading

        self.expected_subtasks = expected_subtasks
        self.policy = policy
        self.next_id = 1
        self.completed: list[int] = []
        self.triggered: set[int] = set()
        self.aborted: set[int] = set()
        self._queue_cls = queue.Queue
        self.lock = threading.Lock()
        self.blobs: dict[str, bytes] = {}
        self.acks: dict[int, dict[tuple[str, int], dict]] = {}
        self.declines: list[tuple[int, str, int, str]] = []
        self.streams: list = []

    def reporter(self, spec):
        return _FakeReporter(self, spec.vertex, spec.subtask_index)

    def events(self, spec):
        stream = _FakeEvents(self._queue_cls())
        self.streams.append(stream)
        return stream

    def publish(self, kind: str, data: dict) -> None:
        for s in self.streams:
            s.queue.put((kind, data))

    def trigger(self, checkpoint_id: int, policy: str = "aligned", alignment_timeout=None, now=None) -> None:
        import time

        self.next_id = max(self.next_id, checkpoint_id + 1)
        self.triggered.add(checkpoint_id)
        self.publish(
            "checkpoint.triggered",
            {
                "checkpoint_id": checkpoint_id,
                "policy": policy,
                "alignment_timeout": alignment_timeout,
                "trigger_timestamp": now if now is not None else int(time.time() * 1000),
                "is_savepoint": False,
            },
        )


class _FakeReporter:
    def __init__(self, coord: InMemoryCoordinator, vertex: str, index: int) -> None:
        self.coord, self.vertex, self.index = coord, vertex, index

    def upload(self, checkpoint_id, kind, data):
        import hashlib

        from spark_plugin.coordination import BlobHandle

        blob_id = f"{checkpoint_id}-{self.vertex}-{self.index}-{kind}"
        with self.coord.lock:
            self.coord.blobs[blob_id] = data
        return BlobHandle(blob_id, hashlib.sha256(data).hexdigest(), len(data))

    def ack(self, checkpoint_id, ack):
        c = self.coord
        with c.lock:
            acks = c.acks.setdefault(checkpoint_id, {})
            acks[(self.vertex, self.index)] = ack
            done = c.expected_subtasks is not None and len(acks) == c.expected_subtasks
            if done:
                c.completed.append(checkpoint_id)
        if done:
            c.publish("checkpoint.completed", {"checkpoint_id": checkpoint_id})

    def request_checkpoint(self):
        c = self.coord
        with c.lock:
            if any(t not in c.completed and t not in c.aborted for t in c.triggered):
                return  # one is pending: refused, as the coordinator's max_concurrent=1 would
            cid = c.next_id
            c.triggered.add(cid)
        c.trigger(cid, c.policy)

    def decline(self, checkpoint_id, reason):
        c = self.coord
        with c.lock:
            c.declines.append((checkpoint_id, self.vertex, self.index, reason))
            first = checkpoint_id not in c.aborted
            c.aborted.add(checkpoint_id)
        if c.expected_subtasks is not None and first:
            c.publish("checkpoint.aborted", {"checkpoint_id": checkpoint_id, "reason": reason})


class _FakeEvents:
    def __init__(self, q) -> None:
        self.queue = q
        self.closed = False

    def __iter__(self):
        while True:
            item = self.queue.get()
            if item is None:
                return
            yield item

    def close(self) -> None:
        self.queue.put(None)
