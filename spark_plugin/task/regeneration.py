"""Regenerated outputs: a deterministic, stateless subtask persists the inputs whose outputs are still in flight, not
those outputs, and sends them again on recovery (``docs/architecture.md``, "Regenerated outputs").

It applies to a job vertex of ``map``/``flat_map``/``filter`` operators declared ``deterministic`` whose one output is
a hash edge of records (``spark_plugin.api.chaining.regenerates``), in last-barrier checkpoints. Both ends count by
key group, so the counts survive a rescale:

- **The producer** (:class:`OutputLog`) counts what it sent per key group of its consumers (``RecordWriter.counts``)
  and keeps each input it processed, with the counts and the buffers finished before it, until every buffer that
  could hold one of its outputs is surely processed downstream: a consumer holds at most its exclusive and floating
  buffers of a channel unprocessed, so a buffer that many older than the last one sent was processed there. At a
  last-barrier checkpoint it forwards its barrier with priority, persists none of what the barrier overtook, and
  snapshots the inputs it still keeps with the counts before the first of them.
- **The consumer** (:class:`InputCounts`) counts per producer and key group the records it processed from a
  regenerating edge, and snapshots those counts with its keyed state (by key group). Its last-barrier snapshot comes
  after every producer's, and a regenerating channel is blocked at its barrier until then, so what the consumer had
  processed is a prefix of what each producer had sent by its snapshot, and the rest is in the producer's log.
- **Recovery.** A restored producer runs the logged inputs through its operators again before anything else and
  sends each output as :class:`~spark_plugin.network.elements.Regenerated`, with the count of its key group
  continued from the snapshot's. The consumer drops one whose count it had reached (it is in its restored state)
  and processes the others. No checkpoint is taken until the replay is through (``CheckpointController.
  during_recovery`` off at both ends), since the counts of a new attempt start again at zero.
"""

from __future__ import annotations

import pickle
from collections import deque
from collections.abc import Callable
from typing import Any

from contract.keygroups import key_group
from spark_plugin.network.elements import Regenerated
from spark_plugin.network.record_writer import RecordWriter

Emit = Callable[[Any], None]

LOG = "regenerate"
"""A producer's part of its state blob: ``{"producer": subtask index, "counts": [per key group], "inputs": [...]}``."""

COUNTS = "consumed"
"""A consumer's part of its state blob: ``{upstream vertex: {key group: {producer: records processed}}}``."""


class OutputLog:
    """A regenerating subtask's log of the inputs whose outputs may still be unprocessed downstream."""

    def __init__(self, writer: RecordWriter, unprocessed_per_channel: int, subtask_index: int) -> None:
        self.writer = writer
        self.counts = writer.counts if writer.counts is not None else writer.count_per_key_group()
        self.unprocessed = unprocessed_per_channel
        """Buffers of a channel its consumer may hold unprocessed: its exclusive and floating buffers."""
        self.subtask_index = subtask_index
        self.entries: deque[tuple[Any, list[int], list[int], list[int]]] = deque()
        """``(input, counts per key group before it, buffers per channel holding what was written before it,
        records written per channel before it)``, oldest first."""
        self.restored: list[dict[str, Any]] = []
        """The logs of the restored checkpoint's subtasks that map to this one, replayed before the loop."""
        self.snapshot_bytes = 0
        """The size of the inputs the last snapshot logged."""

    def wrap(self, process: Emit) -> Emit:
        """``process`` with every input logged first."""
        entries, counts, finished, sent, trim = (
            self.entries, self.counts, self.writer.finished, self.writer.sent, self.trim
        )
        builders = self.writer.builders

        def logged(record: Any) -> None:
            # per channel, the buffers that hold what was written so far (finished ones and the one filling)
            holding = [f + (b.records > 0) for f, b in zip(finished, builders, strict=True)]
            entries.append((record, counts.copy(), holding, sent.copy()))
            if len(entries) > 1:
                trim()
            process(record)

        return logged

    def trim(self) -> None:
        """Forget the oldest inputs whose outputs are all in buffers processed downstream. An input's outputs on a
        channel it wrote to are in the buffers that held what was written when the next input came; those are
        processed once they are sent and older than the last ``unprocessed`` sent."""
        entries = self.entries
        channels = self.writer.channels
        finished = self.writer.finished
        # buffers of each channel surely processed downstream: finished, minus those still queued here, minus those
        # the consumer may hold (a stale queue count read here is too high, never too low: the sender only takes)
        done = [f - ch.buffers - self.unprocessed for f, ch in zip(finished, channels, strict=True)]
        while len(entries) > 1:
            head, after = entries[0], entries[1]
            for c, (before, then) in enumerate(zip(head[3], after[3], strict=True)):
                if then != before and after[2][c] > done[c]:
                    return
            entries.popleft()

    def snapshot(self) -> dict[str, Any]:
        """The inputs still logged (pickled: :attr:`snapshot_bytes` is their size, the in-flight data this
        checkpoint persists in place of their outputs) and the counts before the first of them."""
        self.trim()
        counts = self.entries[0][1] if self.entries else self.counts
        inputs = pickle.dumps([e[0] for e in self.entries], protocol=5)
        self.snapshot_bytes = len(inputs) if self.entries else 0
        return {"producer": self.subtask_index, "counts": list(counts), "inputs": inputs}

    def replay(self, bind: Callable[[Emit], Emit]) -> int:
        """Send the outputs of every restored log again (before any other output); returns the inputs replayed.
        ``bind(emit)`` is the operator chain bound to ``emit``."""
        n = 0
        for log in self.restored:
            counts = list(log["counts"])
            process = bind(self.writer.regenerating_emit(log["producer"], counts))
            for record in logged_inputs(log):
                process(record)
                n += 1
        self.writer.flush_all()
        self.restored = []
        return n


def logged_inputs(log: dict[str, Any]) -> list[Any]:
    """The inputs of a snapshot's log, oldest first."""
    return pickle.loads(log["inputs"])


class InputCounts:
    """A consumer's records processed per producer and key group, for each regenerating input edge."""

    def __init__(self, key_fns: dict[str, Callable[[Any], Any]], max_parallelism: int,
                 key_group_range: tuple[int, int]) -> None:
        self.key_fns = key_fns
        self.max_parallelism = max_parallelism
        self.range = key_group_range
        self.counts: dict[tuple[str, int], list[int]] = {}
        """``(upstream vertex, producer) -> records processed per key group`` in this attempt."""
        self.restored: dict[str, dict[int, dict[int, int]]] = {}
        """``upstream vertex -> key group -> producer -> records processed`` before the restored checkpoint."""

    def wrap(self, process: Emit, vertex: str, producer: int) -> Emit:
        """``process`` for the records of one regenerating channel: counted, and a regenerated one dropped when it
        was processed before the restored checkpoint."""
        key_fn, maxp = self.key_fns[vertex], self.max_parallelism
        counts = self.counts.setdefault((vertex, producer), [0] * maxp)
        before = self.restored.setdefault(vertex, {})

        def counted(record: Any) -> None:
            if type(record) is Regenerated:
                inner = record.record
                seen = before.get(key_group(key_fn(inner), maxp))
                if seen is None or record.count > seen.get(record.producer, 0):
                    process(inner)
                return
            counts[key_group(key_fn(record), maxp)] += 1
            process(record)

        return counted

    def snapshot(self) -> dict[str, dict[int, dict[int, int]]]:
        """The counts of this attempt by upstream vertex, key group and producer (key groups with none left out)."""
        out: dict[str, dict[int, dict[int, int]]] = {}
        for (vertex, producer), counts in self.counts.items():
            groups = out.setdefault(vertex, {})
            for g, n in enumerate(counts):
                if n:
                    groups.setdefault(g, {})[producer] = n
        return out

    def restore(self, state: dict[str, dict[int, dict[int, int]]]) -> None:
        """Add one old subtask's counts: the key groups of this subtask's range."""
        lo, hi = self.range
        for vertex, groups in state.items():
            mine = self.restored.setdefault(vertex, {})
            for g, by_producer in groups.items():
                if lo <= g <= hi:
                    mine.setdefault(g, {}).update(by_producer)
