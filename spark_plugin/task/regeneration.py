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

TRIM_EVERY = 32
"""Inputs logged between two trims of the log: a log holds at most this many inputs more than it needs."""

LOG = "regenerate"
"""A producer's part of its state blob: ``{"producer": subtask index, "counts": [per key group], "inputs": [...]}``."""

COUNTS = "consumed"
"""A consumer's part of its state blob: ``{upstream vertex: {key group: {producer: records processed}}}``."""


class OutputLog:
    """A regenerating subtask's log of the inputs whose outputs may still be unprocessed downstream.

    Kept flat, since a 1:1 ``map`` logs every record: the inputs in a deque, and per output, in the writer's arrays,
    its key group and the index of the buffer it went into (``RecordWriter.track_outputs``); no object per input
    besides the input itself."""

    def __init__(self, writer: RecordWriter, unprocessed_per_channel: int, subtask_index: int) -> None:
        self.writer = writer
        self.groups, self.buffers = writer.track_outputs()
        assert writer.counts is not None
        self.counts = writer.counts
        self.unprocessed = unprocessed_per_channel
        """Buffers of a channel its consumer may hold unprocessed: its exclusive and floating buffers."""
        self.subtask_index = subtask_index
        self.records: deque[Any] = deque()
        """The inputs kept, oldest first."""
        self.starts: deque[int] = deque()
        """The number of each kept input's first output (outputs numbered from 0 as the log began)."""
        self.base = 0
        """The number of the output the arrays' first element is."""
        self.head_counts = [0] * len(self.counts)
        """Outputs per key group of the inputs forgotten: the counts before the oldest input kept."""
        self.restored: list[dict[str, Any]] = []
        """The logs of the restored checkpoint's subtasks that map to this one, replayed before the loop."""
        self.snapshot_bytes = 0
        """The size of the inputs the last snapshot logged."""

    def wrap(self, process: Emit) -> Emit:
        """``process`` with every input logged first."""
        records, starts, groups, trim = self.records, self.starts, self.groups, self.trim
        since = [0]

        def logged(record: Any) -> None:
            records.append(record)
            starts.append(self.base + len(groups))
            since[0] += 1
            if since[0] >= TRIM_EVERY:  # now and then: it reads every channel's queue (the snapshot trims too)
                since[0] = 0
                trim()
            process(record)

        return logged

    def trim(self) -> None:
        """Forget the oldest inputs whose outputs are all in buffers processed downstream: sent, and older than the
        last ``unprocessed`` sent on their channel."""
        records, starts, groups, buffers = self.records, self.starts, self.groups, self.buffers
        channels = self.writer.channels
        n, maxp = len(channels), len(self.counts)
        # buffers of each channel surely processed downstream: finished, minus those still queued here, minus those
        # the consumer may hold (a stale queue count read here is too high, never too low: the sender only takes)
        done = [f - ch.buffers - self.unprocessed for f, ch in zip(self.writer.finished, channels, strict=True)]
        base, head = self.base, self.head_counts
        total = base + len(groups)
        while records:
            first = starts[0] - base
            last = (starts[1] if len(starts) > 1 else total) - base
            for k in range(first, last):
                if buffers[k] >= done[groups[k] * n // maxp]:
                    break
            else:
                for k in range(first, last):
                    head[groups[k]] += 1
                records.popleft()
                starts.popleft()
                continue
            break
        cut = (starts[0] if starts else total) - base
        if cut > 4096 and cut > len(groups) // 2:  # the arrays' forgotten head, dropped now and then
            del groups[:cut]
            del buffers[:cut]
            self.base = base + cut

    def snapshot(self) -> dict[str, Any]:
        """The inputs still logged (pickled: :attr:`snapshot_bytes` is their size, the in-flight data this
        checkpoint persists in place of their outputs) and the counts before the first of them."""
        self.trim()
        inputs = pickle.dumps(list(self.records), protocol=5)
        self.snapshot_bytes = len(inputs) if self.records else 0
        return {"producer": self.subtask_index, "counts": list(self.head_counts), "inputs": inputs}

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
