"""``CollectSink`` and ``DiscardSink``: sinks for tests and benchmarks (a collecting sink returns its records to the driver)."""

from __future__ import annotations

from typing import Any

from spark_plugin.connectors.base import Sink


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
