"""The connector contracts: what a pipeline's sources and sinks implement (``Source``, ``Sink``).

A source subtask polls its :class:`Source` from the subtask's one loop, so ``poll`` never blocks; its offsets make a
restore resume where a checkpoint was. A sink subtask writes into its :class:`Sink`; what must survive a restore is
its snapshot, and a sink that makes output visible on checkpoints commits in ``notify_checkpoint_complete``.
Implementations live beside this module (``sequence``, ``collect``, ``files``, ``postgres``, ``redis_streams``).
"""

from __future__ import annotations

from typing import Any


class Source:
    """A source subtask's reader. ``poll`` never blocks; offsets make a restore resume where a checkpoint was."""

    def open(self, subtask_index: int, parallelism: int) -> None:
        self.subtask_index = subtask_index
        self.parallelism = parallelism

    def poll(self, max_records: int) -> list[Any] | None:
        """Up to ``max_records`` records; [] when none is ready now; None when the source has ended."""
        raise NotImplementedError

    def wait_hint(self) -> float | None:
        """Seconds until ``poll`` may return records again (None: unknown, poll again when convenient)."""
        return None

    def offsets(self) -> dict[str, Any]:
        """The position to resume from, as JSON-compatible values."""
        raise NotImplementedError

    def seek(self, offsets: dict[str, Any]) -> None:
        """Resume from ``offsets`` taken by :meth:`offsets`."""
        raise NotImplementedError

    def restore_positions(self, positions: list[dict[str, Any]]) -> None:
        """Resume at another parallelism than the checkpoint's. ``positions`` are the offsets of every source
        subtask of the checkpoint, in subtask order; take the splits (partitions, files, streams) this subtask owns
        at its parallelism, each where the checkpoint left it, so every input is read exactly once."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot resume at another parallelism than the checkpoint's ({len(positions)}): "
            "it does not say how its positions split; restore it at that parallelism"
        )

    def partitions(self) -> list[Any]:
        """The partitions (splits) this subtask reads, for watermarks per partition: each holds the subtask's
        watermark back, and goes idle, on its own ([]: the subtask's records count as one partition)."""
        return []

    def partition_of(self, record: Any) -> Any:
        """The partition (one of :meth:`partitions`) that ``record`` was read from."""
        return None

    def close(self) -> Any:
        return None


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
