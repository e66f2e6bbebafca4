"""Sinks: the collecting sink for tests (its records are returned to the driver when the run ends)."""

from __future__ import annotations

from typing import Any


class Sink:
    """A sink subtask's writer. ``snapshot`` returns what must survive a restore; commit on completion.

    ``restore`` may be called once per slice of state: after a rescale a subtask gets the state of every old
    subtask that maps to it, so a sink merges what it is given.

    A sink that makes its output visible only when a checkpoint completes sets ``commits_on_checkpoints``:
    the sources of its pipeline then end with a final checkpoint, so a bounded run commits all its output.
    """

    commits_on_checkpoints = False

    def open(self, subtask_index: int, parallelism: int) -> None:
        self.subtask_index = subtask_index
        self.parallelism = parallelism

    def write(self, record: Any) -> None:
        raise NotImplementedError

    def snapshot(self, checkpoint_id: int) -> Any:
        return None

    def restore(self, state: Any) -> None:
        pass

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        pass

    def close(self) -> Any:
        return None


class CollectSink(Sink):
    """Keeps every record it receives; its operator state is the list so far, and the driver gets the list.

    ``completed`` lists the checkpoints whose completion it was told about, in order.
    """

    def __init__(self) -> None:
        self.records: list[Any] = []
        self.completed: list[int] = []

    def open(self, subtask_index: int, parallelism: int) -> None:
        super().open(subtask_index, parallelism)

    def write(self, record: Any) -> None:
        self.records.append(record)

    def snapshot(self, checkpoint_id: int) -> Any:
        return {"records": list(self.records)}

    def restore(self, state: Any) -> None:
        self.records.extend(state["records"])  # after a rescale, several old subtasks' slices

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.completed.append(checkpoint_id)

    def close(self) -> Any:
        return {"records": self.records, "completed": self.completed}


class DiscardSink(Sink):
    """Drops records; counts them."""

    def __init__(self) -> None:
        self.count = 0

    def write(self, record: Any) -> None:
        self.count += 1

    def snapshot(self, checkpoint_id: int) -> Any:
        return {"count": self.count}

    def restore(self, state: Any) -> None:
        self.count += int(state["count"])

    def close(self) -> Any:
        return {"count": self.count}
