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
