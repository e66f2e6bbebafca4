"""Sinks: the collecting sink for tests (its records are returned to the driver when the run ends)."""

from __future__ import annotations

from typing import Any


class Sink:
    """A sink subtask's writer. ``snapshot`` returns what must survive a restore; commit on completion.

    ``restore`` may be called once per slice of state: after a rescale a subtask gets the state of every old
    subtask that maps to it, so a sink merges what it is given.

    A sink that makes its output visible only when a checkpoint completes sets ``commits_on_checkpoints``:
    the sources of its pipeline then end with a final checkpoint, so a bounded run commits all its output.

    Every attempt calls ``rewind`` first, before ``restore`` and before any record: the job runs again from a
    checkpoint, so a sink that already made output of a later checkpoint visible (a restore that fell back past
    a corrupt checkpoint, or one started from an older checkpoint by name) withdraws it there, since the attempt
    produces it again.
    """

    commits_on_checkpoints = False
    job_id: int = 0

    def open(self, subtask_index: int, parallelism: int) -> None:
        self.subtask_index = subtask_index
        self.parallelism = parallelism

    def write(self, record: Any) -> None:
        raise NotImplementedError

    def snapshot(self, checkpoint_id: int) -> Any:
        return None

    def rewind(self, job_id: int, checkpoint_id: int | None) -> None:
        """The attempt of job ``job_id`` starts from ``checkpoint_id`` (None: from the start of its input).

        Output this sink committed for the job's checkpoints after ``checkpoint_id`` is produced again by this
        attempt: an externally visible sink withdraws it here. Called once per subtask, on every attempt, and
        before any checkpoint of the attempt can complete (it needs this subtask's acknowledgement), so nothing
        the attempt commits can be withdrawn.
        """
        self.job_id = job_id

    def restore(self, state: Any) -> None:
        pass

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        pass

    def uncommitted(self) -> bool:
        """Whether output written so far waits for a checkpoint to complete (a finished run waits for it)."""
        return False

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
