"""The connector contracts: what a pipeline's sources and sinks implement (``PartitionedSource`` and its
``SplitReader``, the older ``Source``, and ``Sink``).

A source subtask polls its :class:`Source` from the subtask's one loop, so ``poll`` never blocks; its offsets make a
restore resume where a checkpoint was. A :class:`PartitionedSource` only lists its splits and reads one split at a
time; the runtime (``split_reading``) assigns splits to subtasks, keeps a position per split in the checkpoint,
moves whole splits on a rescale and picks up new splits while running, so such a source rescales without any
restore code of its own. A sink subtask writes into its :class:`Sink`; what must survive a restore is
its snapshot, and a sink that makes output visible on checkpoints commits in ``notify_checkpoint_complete``.
Implementations live beside this module (``sequence``, ``collect``, ``files``, ``postgres``, ``redis_streams``).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from spark_plugin.connectors.split_reading import SplitReading


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

    def pause(self) -> None:
        """The subtask has no room for records (backpressure): ``poll`` is not called until :meth:`resume`. A
        source that fetches ahead of ``poll`` (a Kafka consumer) may go on within a bound of its own."""

    def resume(self) -> None:
        """The subtask polls again after :meth:`pause`."""

    def snapshot_started(self, checkpoint_id: int) -> None:
        """The subtask snapshots checkpoint ``checkpoint_id`` now: the :meth:`offsets` the runtime takes next (in
        the same call, before any further record) are that checkpoint's."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed. A restore resumes from its offsets, which the coordinator keeps:
        a source may report them elsewhere (a Kafka source commits them back to its group, for monitoring), never
        depend on that for correctness."""

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

    def finished_partitions(self) -> Collection[Any]:
        """The partitions of :meth:`partitions` read to their end: they hold the watermark back no more."""
        return ()

    def split_metrics(self, limit: int) -> dict[str, Any]:
        """The live metrics of this subtask's splits, at most ``limit`` of them ({}: a source without splits)."""
        return {}

    def close(self) -> Any:
        return None

    def release(self) -> None:
        """Free what the source holds outside Python (connections, consumers), without returning anything: called
        when the subtask ends, after a failure as after ``close``; a second call does nothing."""


class SplitReader:
    """Reads one split (a Kafka partition, a file, a stream, a sequence range) of a :class:`PartitionedSource` from
    its position on. Called from the subtask's one loop: ``poll`` never blocks."""

    def poll(self, max_records: int) -> list[Any] | None:
        """Up to ``max_records`` records of this split; [] when none is ready now; None when the split has ended
        (it is not read again, also after a restore)."""
        raise NotImplementedError

    def position(self) -> Any:
        """Where the split stands after the records returned so far, as a JSON-compatible value that
        :meth:`PartitionedSource.build_split_reader` resumes from (a Kafka offset, a byte position, an entry id)."""
        raise NotImplementedError

    def wait_hint(self) -> float | None:
        """Seconds until ``poll`` may return records again (None: unknown)."""
        return None

    def lag(self) -> int | None:
        """Records (or another unit the source names: bytes, rows) behind the split's end, for the live metrics
        (None: unknown). Called about once a second from the subtask's loop: return a figure the reader already
        holds (a Kafka consumer's cached high watermark), never ask a broker or read a file for it."""
        return None

    def pause(self) -> None:
        """The runtime takes no records from this split for now (backpressure). A reader that fetches ahead may go
        on, within a bound of its own, so that records are at hand when the runtime resumes it."""

    def resume(self) -> None:
        """The runtime takes records from this split again."""

    def close(self) -> None:
        """The split ended, moved away, or the subtask ends: release what the reader holds."""


class PartitionedSource(Source):
    """A source made of splits, each read on its own from a position. Implement :meth:`list_splits` and
    :meth:`build_split_reader`; the runtime does the rest, the same for every source:

    * it assigns each split to one subtask with a function of the split id and the parallelism only
      (``split_reading.split_owner``), so subtasks agree without talking and a rescale moves whole splits;
    * it keeps every split's position in the checkpoint (the subtask's source offsets) and, on a restore at any
      parallelism, merges the positions of every old subtask and opens the splits it owns now, each where the
      checkpoint left it;
    * it calls :meth:`list_splits` at the start and, with ``discovery_interval``, again while running: a split it
      did not know is read from ``build_split_reader(split, None)`` (its beginning, or wherever the source says);
    * it reads its splits round robin, a batch of one split per poll, pauses them under backpressure, and keeps
      event time (watermarks, idleness) per split: a split is a partition for :class:`WatermarkStrategy`.

    Split ids are strings that name the same split in every process and run. An id that ends in a number
    (``orders-3``, ``7``) goes round robin by that number, from a start that depends on the rest of the id (Flink's
    Kafka split assignment); any other id by a stable hash.
    """

    discovery_interval: float | None = None
    """Seconds between two calls of :meth:`list_splits` while running (None: only at the start)."""

    restored_splits: list[str] = []
    """Set by the runtime before it calls :meth:`list_splits`: the splits of the checkpoint restored (empty at a
    fresh start), for a source whose splits depend on its first run."""

    def list_splits(self) -> list[str]:
        """Every split id of the source now (all subtasks', not only this one's). Called after :meth:`open`."""
        raise NotImplementedError

    def build_split_reader(self, split: str, position: Any | None) -> SplitReader:
        """A reader of ``split`` from ``position`` (one :meth:`SplitReader.position` returned; None: a split not
        read before)."""
        raise NotImplementedError

    def legacy_offsets(self, offsets: dict[str, Any], subtask_index: int, parallelism: int) -> dict[str, Any]:
        """Offsets this source wrote before it read splits (by subtask ``subtask_index`` of ``parallelism``), as
        offsets of splits: ``{"split_positions": {split: position}, "finished_splits": [split, ...]}``. Only a
        source with such checkpoints implements it."""
        raise ValueError(
            f"{type(self).__name__}: the checkpoint's offsets {offsets!r} are not positions of splits "
            "(offsets of another source, or of a version of this one that did not read splits)"
        )

    # ------------------------------------------------------------------ the Source methods, done by the runtime

    def open(self, subtask_index: int, parallelism: int) -> None:
        super().open(subtask_index, parallelism)
        self.reading = SplitReading(self, subtask_index, parallelism)
        self.reading.start({})

    def poll(self, max_records: int) -> list[Any] | None:
        return self.reading.poll(max_records)

    def wait_hint(self) -> float | None:
        return self.reading.wait_hint()

    def pause(self) -> None:
        self.reading.pause()

    def resume(self) -> None:
        self.reading.resume()

    def offsets(self) -> dict[str, Any]:
        return self.reading.offsets()

    def seek(self, offsets: dict[str, Any]) -> None:
        self.restore_positions_of({self.subtask_index: offsets}, self.parallelism)

    def restore_positions(self, positions: list[dict[str, Any]]) -> None:
        self.restore_positions_of(dict(enumerate(positions)), len(positions))

    def restore_positions_of(self, offsets: dict[int, dict[str, Any]], parallelism: int) -> None:
        """Resume from the offsets of old subtasks (by index, of ``parallelism``): every split where they left it."""
        self.reading.restore(offsets, parallelism)

    def partitions(self) -> list[Any]:
        return self.reading.splits()

    def partition_of(self, record: Any) -> Any:
        """The split of the last batch polled (the runtime hands a batch on before it polls again)."""
        return self.reading.current

    def finished_partitions(self) -> Collection[Any]:
        return self.reading.finished

    def split_metrics(self, limit: int) -> dict[str, Any]:
        reading = getattr(self, "reading", None)  # None: not opened (or a subclass's open did not call this one)
        return {} if reading is None else reading.metrics(limit)

    def close(self) -> Any:
        reading = getattr(self, "reading", None)
        if reading is not None:
            reading.close()
        return None

    def release(self) -> None:
        self.close()  # closing the split readers frees theirs; it returns nothing a failed subtask would need


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

    def attempt_over(self, reason: str) -> None:
        """This subtask's attempt is over (a newer attempt started, or the job ended): ``reason`` says which.

        Called once, on another thread than the one writing (the coordinator's event feed), while this subtask
        may still be writing: a zombie of a failed attempt. A sink whose commit takes long stops it here, so that
        it writes nothing after the next attempt has fenced it. The default does nothing."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        pass

    def uncommitted(self) -> bool:
        """Whether output written so far waits for a checkpoint to complete (a finished run waits for it)."""
        return False

    def close(self) -> Any:
        return None

    def release(self) -> None:
        """Free what the sink holds outside Python (connections, producers) without committing anything: called
        when the subtask ends, after a failure as after ``close``; a second call does nothing. Output not yet
        committed stays uncommitted (an open transaction is aborted by the next attempt's fencing)."""
