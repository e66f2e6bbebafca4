"""The operator chain of one subtask: its own copies of the vertex's operators, opened, bound into one call per record,
snapshotted and restored together."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from typing import Any

from pyspark import cloudpickle

from contract.models import RestoreState, SourcePosition
from spark_plugin.api.operators import Operator, SourceOperator
from spark_plugin.connectors.base import PartitionedSource, Source
from spark_plugin.network.recovered import FetchBlob, RestoreMismatch
from spark_plugin.task.regeneration import COUNTS, LOG, InputCounts, OutputLog

Emit = Callable[[Any], None]

log = logging.getLogger(__name__)


class OperatorChain:
    """The operators of a subtask's job vertex, head first (a source, if the chain starts with one)."""

    def __init__(self, operators: list[Operator]) -> None:
        self.operators = operators
        head = operators[0]
        self.source: Source | None = head.source if isinstance(head, SourceOperator) else None
        self.keyed = any(op.keyed for op in operators)
        self.event_time_state: Callable[[], Any] | None = None
        """The subtask's event-time state (watermarks per input channel, ...), snapshotted with the operators."""
        self.restored_event_time: list[Any] = []
        """The event-time state of every blob restored (several after a rescale)."""
        self.output_log: OutputLog | None = None
        """A regenerating subtask's log of inputs (``spark_plugin.task.regeneration``), set by the subtask."""
        self.input_counts: InputCounts | None = None
        """The records processed per producer and key group of regenerating input edges, set by the subtask."""

    @classmethod
    def copy_of(cls, operators: list[Operator]) -> OperatorChain:
        """A chain of fresh copies of ``operators`` (as a Spark task would unpickle them)."""
        return cls(cloudpickle.loads(cloudpickle.dumps(operators)))

    @property
    def head(self) -> Operator:
        return self.operators[0]

    def open(self, subtask_index: int, parallelism: int, max_parallelism: int) -> None:
        for op in self.operators:
            op.open(subtask_index, parallelism, max_parallelism)

    def bind(self, emit: Emit) -> Emit:
        """The function that processes one record through every operator and hands the results to ``emit``."""
        for op in reversed(self.operators):
            emit = op.bind(emit)
        return emit

    def bind_side_outputs(self, emits: dict[str, Emit]) -> None:
        """Hand the operators that send to a side output (a window's late records) the functions that do."""
        for op in self.operators:
            bind = getattr(op, "bind_side_outputs", None)
            if bind is not None:
                bind(emits)

    def rewind(self, job_id: int, checkpoint_id: int | None) -> None:
        """An attempt of ``job_id`` starts from ``checkpoint_id``: before ``restore``, before any record (sinks
        withdraw output of later checkpoints that they committed, since this attempt produces it again)."""
        for op in self.operators:
            op.rewind(job_id, checkpoint_id)

    def attempt_over(self, reason: str) -> None:
        """The attempt is over while this chain may still run (a zombie): its sinks stop writing (any thread)."""
        for op in self.operators:
            over = getattr(op, "attempt_over", None)
            if over is not None:
                over(reason)

    def snapshot(self, checkpoint_id: int, regenerate: bool = False) -> bytes | None:
        """Every operator's state for the checkpoint, as one blob (None when the chain is stateless); with
        ``regenerate`` (a last-barrier checkpoint) also the log of inputs of a regenerating subtask and the counts of
        a consumer of one."""
        states = {op.id: op.snapshot(checkpoint_id) for op in self.operators}
        event_time = self.event_time_state() if self.event_time_state is not None else None
        extra: dict[str, Any] = {}
        if regenerate and self.output_log is not None:
            extra[LOG] = self.output_log.snapshot()
        if regenerate and self.input_counts is not None:
            extra[COUNTS] = self.input_counts.snapshot()
        if all(s is None for s in states.values()) and event_time is None and not extra:
            return None
        blob: dict[str, Any] = {"operators": states, **extra}
        if event_time is not None:
            blob["event_time"] = event_time
        return pickle.dumps(blob, protocol=5)

    def restore(self, blob: bytes, keyed_only: bool) -> None:
        """Load one old subtask's state blob: every operator's part, or with ``keyed_only`` only keyed operators'
        (each keeps the key groups of its own range); its event-time state is kept in any case (the subtask's event
        time combines those of every old subtask it restores from)."""
        data = pickle.loads(blob)
        states = data["operators"]
        for op in self.operators:
            state = states.get(op.id)
            if state is not None and (op.keyed or not keyed_only):
                op.restore(state)
        if data.get("event_time") is not None:
            self.restored_event_time.append(data["event_time"])
        if data.get(LOG) is not None and not keyed_only:
            if self.output_log is None:
                raise RestoreMismatch(
                    "the checkpoint holds inputs whose outputs this vertex regenerates, but its operators are no "
                    "longer all map, flat_map or filter with deterministic=True and one key_by output: declare them "
                    "so again, or restore from a checkpoint that is not a last-barrier one"
                )
            self.output_log.restored.append(data[LOG])
        if data.get(COUNTS) and self.input_counts is not None:
            self.input_counts.restore(data[COUNTS])

    def restore_slices(self, slices: list[RestoreState], fetch: FetchBlob, subtask_index: int, parallelism: int) -> int:
        """Load the operator state of a restore plan, this subtask's own slice first; returns the blobs loaded.

        Keyed state comes from every slice (each operator keeps the key groups of its range); other state only from
        the old subtasks that map to this one (``from_subtask % parallelism``)."""
        for ref in sorted(slices, key=lambda r: (r.from_subtask != subtask_index, r.from_subtask)):
            self.restore(fetch(ref.blob_id, None, None), keyed_only=ref.from_subtask % parallelism != subtask_index)
        return len(slices)

    def position_source(self, own: dict[str, Any] | None, positions: list[SourcePosition]) -> None:
        """Where the chain's source resumes. A partitioned source takes every old subtask's split positions and keeps
        the splits it owns now (at any parallelism: split positions are union state); an older ``Source`` seeks to
        its own offsets, or after a rescale splits the old subtasks' positions itself (``restore_positions``)."""
        source = self.source
        if source is None:
            return
        by_subtask = {p.from_subtask: p.offsets for p in positions}
        if isinstance(source, PartitionedSource):
            if by_subtask:
                source.restore_positions_of(by_subtask, max(by_subtask) + 1)
            elif own:
                source.seek(own)
        elif own:
            source.seek(own)
        elif by_subtask:
            source.restore_positions([by_subtask[i] for i in sorted(by_subtask)])

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        for op in self.operators:
            op.notify_checkpoint_complete(checkpoint_id)

    def uncommitted(self) -> bool:
        """Whether a sink of the chain holds output that waits for a checkpoint to complete."""
        return any(op.uncommitted() for op in self.operators)

    def close(self) -> dict[str, Any]:
        """Close every operator; what each returns (a sink's output for the driver), by operator id."""
        outputs: dict[str, Any] = {}
        for op in self.operators:
            out = op.close()
            if out is not None:
                outputs[op.id] = out
        return outputs

    def release(self) -> None:
        """Free what every operator holds outside Python (after a failure as after ``close``); an operator whose
        release fails is logged and the others are released still."""
        for op in self.operators:
            try:
                op.release()
            except Exception:
                log.warning("releasing operator %s failed", op.id, exc_info=True)
