"""The pipeline definition: sources, transformations, keyed operators and sinks, validated and chained in the driver.

    p = Pipeline("counts", parallelism=2)
    (p.source(SequenceSource(count=10_000, keys=50), id="numbers")
      .key_by(lambda r: r[0])
      .aggregate(lambda: 0, lambda acc, r: acc + 1, id="count")
      .sink(CollectSink(), id="out"))
    result = p.run(spark, coordinator="http://127.0.0.1:8321", checkpoint=CheckpointConfig(interval=1000))

A definition only describes the pipeline; ``spark_plugin.Pipeline`` adds ``run``. Every definition error (wiring,
parallelism, a function that cannot be pickled) raises :class:`PipelineError` naming the operator, before Spark
starts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contract.models import NAME_RE
from spark_plugin.api import operators as ops
from spark_plugin.api import windowed as event_time
from spark_plugin.api.chaining import chain
from spark_plugin.api.errors import PipelineError
from spark_plugin.api.graph import Input, Node
from spark_plugin.api.timers import KeyedProcessFunction
from spark_plugin.api.validation import validate
from spark_plugin.api.watermarks import WatermarkStrategy
from spark_plugin.api.windows import WindowAssigner
from spark_plugin.connectors.base import Sink, Source
from spark_plugin.plan.job import JobPlan

PARTITIONINGS = ("forward", "rebalance", "hash", "broadcast")


class Stream:
    """The output of an operator, with the partitioning that the next operator's input edge will use."""

    def __init__(self, pipeline: PipelineDefinition, node: Node, partitioning: str = "forward", key_fn=None) -> None:
        self.pipeline = pipeline
        self.node = node
        self.partitioning = partitioning
        self.key_fn = key_fn

    def _add(self, op: ops.Operator) -> Stream:
        node = self.pipeline._add_node(op, [(self.node, self.partitioning, self.key_fn)])
        return Stream(self.pipeline, node)

    def _parallelism(self, parallelism: int | None) -> int | None:
        if parallelism is None and self.partitioning == "forward":
            return self.node.op.parallelism
        return parallelism

    def map(self, fn: Callable[[Any], Any], *, id: str | None = None, parallelism: int | None = None) -> Stream:
        """One output record per input record."""
        return self._add(ops.Map(self.pipeline._id(id, "map"), fn, parallelism=self._parallelism(parallelism)))

    def flat_map(self, fn: Callable[[Any], Any], *, id: str | None = None, parallelism: int | None = None) -> Stream:
        """Any number of output records (an iterable) per input record."""
        op = ops.FlatMap(self.pipeline._id(id, "flat_map"), fn, parallelism=self._parallelism(parallelism))
        return self._add(op)

    def filter(self, fn: Callable[[Any], bool], *, id: str | None = None, parallelism: int | None = None) -> Stream:
        """Keep the records for which ``fn`` is true."""
        op = ops.Filter(self.pipeline._id(id, "filter"), fn, parallelism=self._parallelism(parallelism))
        return self._add(op)

    def rebalance(self) -> Stream:
        """Spread records round robin over the next operator's subtasks."""
        return Stream(self.pipeline, self.node, "rebalance")

    def broadcast(self) -> Stream:
        """Send every record to every subtask of the next operator."""
        return Stream(self.pipeline, self.node, "broadcast")

    def key_by(self, key_fn: Callable[[Any], Any]) -> KeyedStream:
        """Partition by key (hash of the key into key groups); the next operator keeps keyed state."""
        return KeyedStream(self.pipeline, self.node, "hash", key_fn)

    def sink(self, sink: Sink, *, id: str | None = None, parallelism: int | None = None) -> None:
        """End the stream in a sink."""
        op = ops.SinkOperator(self.pipeline._id(id, "sink"), sink, parallelism=self._parallelism(parallelism))
        self._add(op)

    def late_records(self, *, id: str | None = None) -> Stream:
        """The records a window operator judged too late for their windows (its side output); this stream must be
        a window's results."""
        op = event_time.late_records_operator(self.node, self.pipeline._id(id, "late-records"))
        return Stream(self.pipeline, self.pipeline._add_node(op, [(self.node, "forward", None)]))


class KeyedStream(Stream):
    """A stream partitioned by key; its operators keep state per key, addressed by key group."""

    def reduce(self, fn: Callable[[Any, Any], Any], *, id: str | None = None, parallelism: int | None = None):
        """Rolling reduce per key; emits the reduced value after each record."""
        op = ops.Reduce(self.pipeline._id(id, "reduce"), self.key_fn, fn, parallelism=parallelism)
        return self._add(op)

    def aggregate(
        self,
        zero: Callable[[], Any],
        add: Callable[[Any, Any], Any],
        *,
        id: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """Rolling aggregate per key from ``zero()``; emits ``(key, accumulator)`` after each record."""
        op = ops.Aggregate(self.pipeline._id(id, "aggregate"), self.key_fn, zero, add, parallelism=parallelism)
        return self._add(op)

    def process(self, fn: Callable | KeyedProcessFunction, *, id: str | None = None, parallelism: int | None = None,
                timestamp: Callable[[Any], int] | None = None) -> Stream:
        """``fn(key, record, state)`` with a :class:`~spark_plugin.api.state.ValueState` per key; returns outputs.

        A :class:`~spark_plugin.api.timers.KeyedProcessFunction` gets a context with timers instead
        (``timestamp`` names the record's event time where it is not the source's)."""
        op_id = self.pipeline._id(id, "process")
        if isinstance(fn, KeyedProcessFunction):
            return self._add(event_time.timed_process(self, fn, op_id, timestamp, parallelism))
        op = ops.Process(op_id, self.key_fn, fn, parallelism=parallelism)
        return self._add(op)

    def window(self, assigner: WindowAssigner, *, allowed_lateness: int = 0,
               timestamp: Callable[[Any], int] | None = None) -> event_time.WindowedStream:
        """Event-time windows per key (``TumblingEventTimeWindows``, ``SlidingEventTimeWindows``,
        ``EventTimeSessionWindows``); records up to ``allowed_lateness`` ms behind the watermark still count.
        Follow with ``reduce``, ``aggregate`` or ``process``."""
        return event_time.WindowedStream(self, assigner, allowed_lateness, timestamp)


class PipelineDefinition:
    """A streaming pipeline's definition: what it reads, computes and writes. ``spark_plugin.Pipeline`` runs it."""

    def __init__(self, name: str, *, parallelism: int = 1, max_parallelism: int = 128) -> None:
        if not NAME_RE.match(name or ""):
            raise PipelineError(f"pipeline name {name!r} must be 1-128 characters of letters, digits, '_', '.', '-'")
        self.name = name
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.nodes: list[Node] = []
        self._counter = 0

    def _id(self, given: str | None, kind: str) -> str:
        if given is not None:
            return given
        self._counter += 1
        return f"{kind}-{self._counter}"

    def _add_node(self, op: ops.Operator, inputs: list[Input]) -> Node:
        node = Node(op, inputs)
        for up, _, _ in inputs:
            up.outputs.append(node)
        self.nodes.append(node)
        return node

    def source(self, source: Source, *, id: str | None = None, parallelism: int | None = None,
               watermarks: WatermarkStrategy | None = None) -> Stream:
        """Add a source; the returned stream forwards to the next operator. ``watermarks`` gives its records event
        time (see :class:`~spark_plugin.api.watermarks.WatermarkStrategy`)."""
        op = ops.SourceOperator(self._id(id, "source"), source, parallelism=parallelism)
        event_time.check_strategy(watermarks, op.id)
        op.watermarks = watermarks
        return Stream(self, self._add_node(op, []))

    def plan(self) -> JobPlan:
        """Validate the definition and chain forward-connected operators; raises :class:`PipelineError`."""
        validate(self.name, self.parallelism, self.max_parallelism, self.nodes)
        return chain(self.name, self.parallelism, self.max_parallelism, self.nodes)
