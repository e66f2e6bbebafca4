"""In-memory stand-ins for tests without Spark: a recording BarrierActions and a coordinator fake."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TypeVar

from contract.events import CheckpointAborted, CheckpointCompleted, CheckpointTriggered, EventPayload
from spark_plugin.network.barrier import CheckpointBarrier

T = TypeVar("T")


class RecordingActions:
    """Records every action a barrier state asks for, as ``(name, args...)`` tuples; ``channels`` input channels,
    of which ``ended`` have ended."""

    def __init__(self, channels: int = 3, now: int = 1_000) -> None:
        self.calls: list[tuple] = []
        self.now = now
        self.channels = channels
        self.ended: set[int] = set()
        self.inflight: dict[int, int] = {}
        """Bytes each input channel queues ahead of its barrier (-1: the output side), for the in-flight budget."""

    def live_channels(self) -> set[int]:
        return set(range(self.channels)) - self.ended

    def recovering(self) -> bool:
        return self.replaying

    replaying = False

    def first_barrier(self, checkpoint_id: int) -> None:
        pass  # only counts bytes; not an action the states' specification looks at

    def snapshot(self, barrier: CheckpointBarrier, unaligned: bool, first_barrier_ms: int) -> None:
        self.calls.append(("snapshot", barrier.checkpoint_id, unaligned))

    def forward_barrier(self, barrier: CheckpointBarrier, priority: bool) -> None:
        self.calls.append(("forward", barrier.checkpoint_id, priority))

    def block(self, channel: int) -> None:
        self.calls.append(("block", channel))

    def unblock_all(self) -> None:
        self.calls.append(("unblock_all",))

    def block_overtaken(self, channel: int, checkpoint_id: int) -> None:
        self.calls.append(("block_overtaken", channel, checkpoint_id))

    def start_persisting(self, channel: int, checkpoint_id: int) -> None:
        self.calls.append(("record", channel, checkpoint_id))

    def stop_persisting(self, channel: int, checkpoint_id: int) -> None:
        self.calls.append(("stop_record", channel))

    def finish_input(self, checkpoint_id: int, last_barrier_ms: int) -> None:
        self.calls.append(("finish_input", checkpoint_id))

    def inflight_bytes(self, checkpoint_id: int, channels: set[int]) -> int:
        return self.inflight.get(-1, 0) + sum(self.inflight.get(ch, 0) for ch in channels)

    def hold_barriers(self, checkpoint_id: int, inflight_bytes: int) -> None:
        self.calls.append(("hold", checkpoint_id, inflight_bytes))

    def abort(self, checkpoint_id: int, reason: str) -> None:
        self.calls.append(("abort", checkpoint_id, reason))

    def now_ms(self) -> int:
        return self.now

    regenerated: frozenset[int] = frozenset()
    """Input channels whose upstream regenerates its output."""
    regenerating = False
    """Whether this subtask regenerates its output."""

    def regenerates(self, channel: int) -> bool:
        return channel in self.regenerated

    def regenerates_output(self) -> bool:
        return self.regenerating

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
        self.running: set[tuple[str, int]] = set()

    def reporter(self, spec):
        return _FakeReporter(self, spec.vertex, spec.subtask_index)

    def events(self, spec):
        stream = _FakeEvents(self._queue_cls())
        self.streams.append(stream)
        return stream

    def publish(self, payload: EventPayload) -> None:
        for s in self.streams:
            s.queue.put(payload)

    def trigger(
        self, checkpoint_id: int, policy: str = "aligned", alignment_timeout=None, now=None, **budget
    ) -> None:
        """``budget``: ``inflight_budget`` and ``over_inflight_budget`` as the coordinator would send them."""
        import time

        self.next_id = max(self.next_id, checkpoint_id + 1)
        self.triggered.add(checkpoint_id)
        self.publish(
            CheckpointTriggered(
                checkpoint_id=checkpoint_id,
                attempt=None,
                policy=policy,
                alignment_timeout=alignment_timeout,
                trigger_timestamp=now if now is not None else int(time.time() * 1000),
                **budget,
            )
        )


class _FakeReporter:
    def __init__(self, coord: InMemoryCoordinator, vertex: str, index: int) -> None:
        self.coord, self.vertex, self.index = coord, vertex, index

    def _store(self, checkpoint_id, kind, data):
        blob_id = f"{checkpoint_id}-{self.vertex}-{self.index}-{kind}"
        with self.coord.lock:
            self.coord.blobs[blob_id] = data
        return {"blob_id": blob_id, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}

    def ack_with_state(self, checkpoint_id, ack, operator_state, channel_state):
        ack = dict(ack)
        if operator_state is not None:
            ack["operator_state"] = self._store(checkpoint_id, "operator", operator_state)
        if channel_state is not None:
            ack["channel_state"] = self._store(checkpoint_id, "channel", channel_state)
        c = self.coord
        with c.lock:
            acks = c.acks.setdefault(checkpoint_id, {})
            acks[(self.vertex, self.index)] = ack
            done = c.expected_subtasks is not None and len(acks) == c.expected_subtasks
            if done:
                c.completed.append(checkpoint_id)
        if done:
            c.publish(CheckpointCompleted(checkpoint_id=checkpoint_id, attempt=None))

    def report_running(self):
        with self.coord.lock:
            self.coord.running.add((self.vertex, self.index))

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
            c.publish(CheckpointAborted(checkpoint_id=checkpoint_id, attempt=None, reason=reason))


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


class StoreCoordinator(InMemoryCoordinator):
    """A coordinator fake whose subtasks write their state into a shared directory themselves (``file://``), as with
    ``OVERTAKE_STATE_WRITES=direct``: triggers carry write targets (``incremental``: references allowed), acks
    name written objects, and references are checked as the coordinator checks them (an object of an earlier
    checkpoint that an ack recorded, a range within its channel state)."""

    def __init__(self, root, expected_subtasks: int | None = None, incremental: bool = True, job_id: int = 7) -> None:
        super().__init__(expected_subtasks)
        self.root = root
        self.incremental = incremental
        self.job_id = job_id
        self.objects: dict[str, dict] = {}
        """Every acked object by key: its ``written`` handle."""
        self.refused: list[str] = []

    def reporter(self, spec):
        return _StoreReporter(self, spec.vertex, spec.subtask_index)

    def state_writer(self, spec):
        from spark_plugin.task.state_store import StateWriter

        return StateWriter(f"{spec.vertex}-{spec.subtask_index}-a1.state")

    def trigger(self, checkpoint_id: int, policy: str = "aligned", alignment_timeout=None, now=None) -> None:
        import time

        from contract.models import WriteTarget, state_prefix

        self.next_id = max(self.next_id, checkpoint_id + 1)
        self.triggered.add(checkpoint_id)
        target = WriteTarget(
            prefix=state_prefix(self.job_id, checkpoint_id), url=self.root.as_uri() + "/", incremental=self.incremental
        )
        self.publish(
            CheckpointTriggered(
                checkpoint_id=checkpoint_id, attempt=None, policy=policy, alignment_timeout=alignment_timeout,
                trigger_timestamp=now if now is not None else int(time.time() * 1000), target=target,
            )
        )

    def complete(self, checkpoint_id: int) -> None:
        with self.lock:
            self.completed.append(checkpoint_id)
        self.publish(CheckpointCompleted(checkpoint_id=checkpoint_id, attempt=None))

    def restore_plan(self, checkpoint_id: int) -> tuple[dict, list]:
        """Per subtask what the coordinator's restore plan holds (no rescaling), and every blob's location: blob
        ids are ``key#operator`` / ``key#channel``, each part names the blob holding it."""
        from contract.models import BlobLocation

        plan: dict = {}
        locations: dict[str, BlobLocation] = {}

        def blob(key: str, kind: str) -> str:
            w = self.objects[key]
            offset, size = (0, w["operator_size"]) if kind == "operator" else (w["operator_size"], w["size"] - w["operator_size"])
            sha = w["operator_sha256"] if kind == "operator" else w["channel_sha256"]
            blob_id = f"{key}#{kind}"
            locations[blob_id] = BlobLocation(
                blob_id=blob_id, sha256=sha, size=size, url=(self.root / key).as_uri(), offset=offset
            )
            return blob_id

        for (vertex, index), ack in self.acks[checkpoint_id].items():
            w = ack["written"]
            segs = []
            for s in ack["channel_segments"]:
                seg = {**s, "blob_id": blob(w["key"], "channel") if w["size"] > w["operator_size"] else None,
                       "from_subtask": index}
                if s.get("parts"):
                    seg["parts"] = [
                        {**p, "blob_id": blob(p["key"], "channel") if p.get("key") else None} for p in s["parts"]
                    ]
                segs.append(seg)
            plan[(vertex, index)] = {
                "operator_state": [
                    {"blob_id": blob(w["key"], "operator"), "sha256": w["operator_sha256"], "size": w["operator_size"],
                     "from_subtask": index}
                ]
                if w["operator_size"]
                else [],
                "source_offsets": ack.get("source_offsets"),
                "output_channel_state": [s for s in segs if s["direction"] == "output"],
                "input_channel_state": [s for s in segs if s["direction"] == "input"],
            }
        return plan, list(locations.values())


class _StoreReporter(_FakeReporter):
    def ack(self, checkpoint_id, ack):
        from client.errors import InvalidRequest

        c = self.coord
        w = ack["written"]
        with c.lock:
            for seg in ack["channel_segments"]:
                for p in seg.get("parts") or []:
                    if p.get("key") is None:
                        continue
                    ref = c.objects.get(p["key"])
                    if ref is None or p["offset"] + p["length"] > ref["size"] - ref["operator_size"]:
                        c.refused.append(p["key"])
                        raise InvalidRequest(422, "invalid", f"object {p['key']} is not kept")
            c.objects[w["key"]] = w
            acks = c.acks.setdefault(checkpoint_id, {})
            acks[(self.vertex, self.index)] = ack
            done = c.expected_subtasks is not None and len(acks) == c.expected_subtasks
            if done:
                c.completed.append(checkpoint_id)
        if done:
            c.publish(CheckpointCompleted(checkpoint_id=checkpoint_id, attempt=None))


def sample_until(take: Callable[[], T], why_not: Callable[[T], object], what: str, tries: int = 4) -> T:
    """``take()`` again, at most ``tries`` times, until ``why_not`` of its result is None, and return that result.

    A test of a restore under backpressure needs a checkpoint that holds data in flight, and what is in flight when
    a barrier passes depends on how the threads were scheduled: on a loaded machine a checkpoint can catch the queues
    drained. The claim is about a checkpoint that holds such data, so the sample is taken again rather than the claim
    weakened. ``why_not`` says what a sample lacks (None: nothing); when every try lacks something, the failure lists
    what each lacked."""
    seen = []
    for _ in range(tries):
        sample = take()
        lacking = why_not(sample)
        if lacking is None:
            return sample
        seen.append(lacking)
    raise AssertionError(f"{tries} samples held no {what}: {seen}")
