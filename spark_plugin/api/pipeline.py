"""The pipeline definition: sources, transformations, keyed operators and sinks, validated and chained in the driver.

    p = Pipeline("counts", parallelism=2)
    (p.source(SequenceSource(count=10_000, keys=50), id="numbers")
      .key_by(lambda r: r[0])
      .aggregate(lambda: 0, lambda acc, r: acc + 1, id="count")
      .sink(CollectSink(), id="out"))
    result = p.run(spark, coordinator="http://127.0.0.1:8321", checkpoint=CheckpointConfig(interval=1000))

A batch pipeline reads Arrow record batches and runs vectorized functions (:class:`BatchStream`):

    (p.source(ParquetSource("orders/", batches=True), id="orders")
      .filter(lambda b: pc.greater(b["amount"], 0))                        # a mask per row
      .map_batches(lambda df: df.assign(cents=df.amount * 100), format="pandas")
      .key_by("customer")                                                  # split by key group, vectorized
      .aggregate({"cents": ["sum", "count"]}, id="per-customer")           # running sums per key, a batch at a time
      .sink(ParquetSink("out/"), id="out"))

Event-time windows over batches take their watermarks from a time column of the source's batches:

    (p.source(ParquetSource("orders/", batches=True), id="orders",
              watermarks=WatermarkStrategy.for_bounded_out_of_orderness(2_000, timestamp="ts").with_idleness(10_000))
      .key_by("customer")
      .window(TumblingEventTimeWindows.of(60_000))                         # or SlidingEventTimeWindows.of(size, slide)
      .aggregate({"amount": ["sum", "mean"]}, id="per-minute")             # customer, window_start, window_end, ...
      .sink(ParquetSink("minutes/"), id="out"))

A definition only describes the pipeline; ``spark_plugin.Pipeline`` adds ``run``. Every definition error (wiring,
parallelism, a function that cannot be pickled) raises :class:`PipelineError` naming the operator, before Spark
starts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contract.models import NAME_RE, Partitioning
from spark_plugin.api import batch_sessions as bs
from spark_plugin.api import batch_windows as bw
from spark_plugin.api import batches as b
from spark_plugin.api import operators as ops
from spark_plugin.api import windowed as event_time
from spark_plugin.api.chaining import chain
from spark_plugin.api.errors import PipelineError
from spark_plugin.api.graph import Input, Node
from spark_plugin.api.timers import KeyedProcessFunction
from spark_plugin.api.validation import validate
from spark_plugin.api.watermarks import WatermarkStrategy
from spark_plugin.api.windows import EventTimeSessionWindows, WindowAssigner
from spark_plugin.connectors.base import Sink, Source
from spark_plugin.plan.job import JobPlan


class Stream:
    """The output of an operator, with the partitioning that the next operator's input edge will use."""

    def __init__(
        self, pipeline: PipelineDefinition, node: Node, partitioning: Partitioning = Partitioning.forward, key_fn=None
    ) -> None:
        self.pipeline = pipeline
        self.node = node
        self.partitioning = partitioning
        self.key_fn = key_fn

    def _add(self, op: ops.Operator) -> Stream:
        node = self.pipeline._add_node(op, [(self.node, self.partitioning, self.key_fn)])
        return Stream(self.pipeline, node)

    def _parallelism(self, parallelism: int | None) -> int | None:
        if parallelism is None and self.partitioning == Partitioning.forward:
            return self.node.op.parallelism
        return parallelism

    def map(self, fn: Callable[[Any], Any], *, id: str | None = None, parallelism: int | None = None,
            deterministic: bool = False) -> Stream:
        """One output record per input record. ``deterministic``: see :meth:`flat_map`."""
        op = ops.Map(self.pipeline._id(id, "map"), fn, deterministic, parallelism=self._parallelism(parallelism))
        return self._add(op)

    def flat_map(self, fn: Callable[[Any], Any], *, id: str | None = None, parallelism: int | None = None,
                 deterministic: bool = False) -> Stream:
        """Any number of output records (an iterable) per input record.

        ``deterministic=True`` promises that ``fn`` returns the same records in the same order for the same input
        and keeps nothing between calls. A job vertex of such operators (not after a source in one chain) whose one
        output is a ``key_by`` edge then persists, in a last-barrier checkpoint, the inputs whose outputs are still
        in flight instead of those outputs, and regenerates them on recovery: its barrier overtakes its output queue
        and its consumers persist nothing of it (README, "Last-barrier checkpoints")."""
        op = ops.FlatMap(self.pipeline._id(id, "flat_map"), fn, deterministic,
                         parallelism=self._parallelism(parallelism))
        return self._add(op)

    def filter(self, fn: Callable[[Any], bool], *, id: str | None = None, parallelism: int | None = None,
               deterministic: bool = False) -> Stream:
        """Keep the records for which ``fn`` is true. ``deterministic``: see :meth:`flat_map`."""
        op = ops.Filter(self.pipeline._id(id, "filter"), fn, deterministic, parallelism=self._parallelism(parallelism))
        return self._add(op)

    def rebalance(self) -> Stream:
        """Spread records round robin over the next operator's subtasks."""
        return Stream(self.pipeline, self.node, Partitioning.rebalance)

    def broadcast(self) -> Stream:
        """Send every record to every subtask of the next operator."""
        return Stream(self.pipeline, self.node, Partitioning.broadcast)

    def key_by(self, key_fn: Callable[[Any], Any]) -> KeyedStream:
        """Partition by key (hash of the key into key groups); the next operator keeps keyed state."""
        return KeyedStream(self.pipeline, self.node, Partitioning.hash, key_fn)

    def sink(self, sink: Sink, *, id: str | None = None, parallelism: int | None = None) -> None:
        """End the stream in a sink."""
        op = ops.SinkOperator(self.pipeline._id(id, "sink"), sink, parallelism=self._parallelism(parallelism))
        self._add(op)

    def as_batches(self) -> BatchStream:
        """This stream as a batch stream (:class:`BatchStream`): its records must be
        ``pyarrow.RecordBatch`` objects (a source's batch form makes them)."""
        return BatchStream(self.pipeline, self.node, self.partitioning, self.key_fn)

    def late_records(self, *, id: str | None = None) -> Stream:
        """The records a window operator judged too late for their windows (its side output); this stream must be
        a window's results."""
        op = event_time.late_records_operator(self.node, self.pipeline._id(id, "late-records"))
        return Stream(self.pipeline, self.pipeline._add_node(op, [(self.node, Partitioning.forward, None)]))


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


class BatchStream(Stream):
    """A stream of ``pyarrow.RecordBatch`` records. ``format="pandas"`` hands user functions pandas DataFrames
    (as Spark's ``mapInPandas`` does) instead of record batches."""

    def _add_batches(self, op: Any) -> BatchStream:
        node = self.pipeline._add_node(op, [(self.node, self.partitioning, self.key_fn)])
        return BatchStream(self.pipeline, node)

    def map_batches(self, fn: Callable[[Any], Any], *, format: str = "arrow", id: str | None = None,
                    parallelism: int | None = None) -> BatchStream:
        """``fn(batch)`` returns a batch (a ``RecordBatch``, ``Table``, ``DataFrame``, dict of columns or list of
        row dicts) or None; empty batches are dropped."""
        op = b.MapBatches(self.pipeline._id(id, "map_batches"), fn, format, parallelism=self._parallelism(parallelism))
        return self._add_batches(op)

    def filter(self, fn: Callable[[Any], Any], *, format: str = "arrow", id: str | None = None,  # type: ignore[override]
               parallelism: int | None = None) -> BatchStream:
        """``fn(batch)`` returns a boolean mask, one entry per row: the rows where it is true go on."""
        op = b.FilterBatches(self.pipeline._id(id, "filter"), fn, format, parallelism=self._parallelism(parallelism))
        return self._add_batches(op)

    def flat_map(self, fn: Callable[[Any], Any], *, format: str = "arrow", id: str | None = None,  # type: ignore[override]
                 parallelism: int | None = None) -> BatchStream:
        """``fn(batch)`` returns an iterable of batches."""
        op = b.FlatMapBatches(self.pipeline._id(id, "flat_map"), fn, format,
                              parallelism=self._parallelism(parallelism))
        return self._add_batches(op)

    def map(self, fn: Callable[[Any], Any], *, id: str | None = None, parallelism: int | None = None) -> Stream:
        raise PipelineError("a batch stream's records are batches: use map_batches(fn), or rows() first to map rows")

    def rebalance(self) -> BatchStream:
        """Spread batches round robin over the next operator's subtasks."""
        return BatchStream(self.pipeline, self.node, Partitioning.rebalance)

    def broadcast(self) -> BatchStream:
        """Send every batch to every subtask of the next operator."""
        return BatchStream(self.pipeline, self.node, Partitioning.broadcast)

    def late_records(self, *, id: str | None = None) -> BatchStream:
        """The rows a batch window judged too late for their windows, as batches (its side output); this stream
        must be a batch window's results."""
        return super().late_records(id=id).as_batches()

    def rows(self, *, id: str | None = None) -> Stream:
        """The rows of every batch as records, one dict per row."""
        return self._add(b.BatchRows(self.pipeline._id(id, "rows"), parallelism=self._parallelism(None)))

    def key_by(self, column: str) -> KeyedBatchStream:  # type: ignore[override]
        """Partition by ``column``: each batch is split, vectorized, by the key group of its rows' keys (a row keeps
        its order among its key's rows); the next operator keeps state per key."""
        if not isinstance(column, str) or not column:
            raise PipelineError(f"key_by on a batch stream takes a column name, not {column!r}")
        split = b.SplitByKeyGroup(self.pipeline._id(None, f"key-by-{column}"), column,
                                  parallelism=self._parallelism(None))
        node = self.pipeline._add_node(split, [(self.node, self.partitioning, self.key_fn)])
        return KeyedBatchStream(self.pipeline, node, Partitioning.hash, b.route_key, column)


class KeyedBatchStream(BatchStream):
    """A batch stream partitioned by a key column: each record a :class:`~spark_plugin.api.batches.KeyedBatch` (the
    rows of one key group)."""

    def __init__(self, pipeline: Any, node: Any, partitioning: Partitioning, key_fn: Any, column: str) -> None:
        super().__init__(pipeline, node, partitioning, key_fn)
        self.column = column

    def aggregate(self, aggs: dict[str, str | list[str]], *, id: str | None = None,  # type: ignore[override]
                  parallelism: int | None = None) -> BatchStream:
        """Running ``sum``, ``count``, ``min``, ``max`` or ``mean`` of columns per key, updated a batch at a time;
        after each batch, one row per key it held: the key, then ``<column>_<aggregate>`` over all its rows so far."""
        op = b.KeyedBatchAggregate(self.pipeline._id(id, "aggregate"), self.column, aggs, parallelism=parallelism)
        node = self.pipeline._add_node(op, [(self.node, self.partitioning, self.key_fn)])
        return BatchStream(self.pipeline, node)

    def window(self, assigner: WindowAssigner, *, timestamp: str | None = None,  # type: ignore[override]
               allowed_lateness: int = 0) -> WindowedBatchStream:
        """Event-time windows per key (``TumblingEventTimeWindows``, ``SlidingEventTimeWindows``,
        ``EventTimeSessionWindows``) over the rows' time column ``timestamp`` (by default the column the source's
        watermark strategy names); rows up to ``allowed_lateness`` ms behind the watermark still count. Follow with
        ``aggregate``."""
        return WindowedBatchStream(self, assigner, timestamp, allowed_lateness)

    def map_batches(self, *a: Any, **kw: Any) -> BatchStream:
        raise PipelineError("a keyed batch stream goes into aggregate(...) or window(...): key_by(column) after "
                            "map_batches")

    filter = flat_map = map_batches  # type: ignore[assignment]


class WindowedBatchStream:
    """A keyed batch stream cut into event-time windows; ``aggregate`` says what each window computes."""

    def __init__(self, keyed: KeyedBatchStream, assigner: WindowAssigner, timestamp: str | None,
                 allowed_lateness: int) -> None:
        if not isinstance(assigner, EventTimeSessionWindows):
            bw.window_shape(assigner)
        if not isinstance(allowed_lateness, int) or allowed_lateness < 0:
            raise PipelineError(f"allowed_lateness must be a non-negative number of ms, got {allowed_lateness!r}")
        strategy = event_time.source_strategy(keyed.node)
        if strategy is None:
            raise PipelineError(
                f"window {assigner!r} after {keyed.node.op.id!r}: its source has no watermarks, so its windows "
                "would fire only when the input ends; give the source watermarks=WatermarkStrategy."
                "for_bounded_out_of_orderness(ms, timestamp=\"<time column>\")"
            )
        if timestamp is None:
            timestamp = getattr(strategy.timestamp, "column", None)
        if not isinstance(timestamp, str) or not timestamp:
            raise PipelineError(
                f"window {assigner!r} after {keyed.node.op.id!r}: name the rows' time column with "
                f"timestamp=\"<column>\" (the source's watermark strategy names none), got {timestamp!r}"
            )
        self.keyed = keyed
        self.assigner = assigner
        self.timestamp = timestamp
        self.allowed_lateness = allowed_lateness

    def aggregate(self, aggs: dict[str, str | list[str]], *, id: str | None = None,
                  parallelism: int | None = None) -> BatchStream:
        """``sum``, ``count``, ``min``, ``max`` or ``mean`` of columns per key and window, updated a batch at a time;
        when the watermark passes a window's end, one batch of a row per key (per key and session, for sessions):
        the key, ``window_start``, ``window_end`` (epoch ms), then ``<column>_<aggregate>``. Its
        ``late_records()`` are the late rows."""
        keyed = self.keyed
        sessions = isinstance(self.assigner, EventTimeSessionWindows)
        kind = bs.KeyedBatchSessionAggregate if sessions else bw.KeyedBatchWindowAggregate
        op = kind(keyed.pipeline._id(id, "window-aggregate"), keyed.column, self.assigner, self.timestamp, aggs,
                  self.allowed_lateness, parallelism=parallelism)
        node = keyed.pipeline._add_node(op, [(keyed.node, keyed.partitioning, keyed.key_fn)])
        return BatchStream(keyed.pipeline, node)


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
        stream = Stream(self, self._add_node(op, []))
        # a source in its batch form (``batches=True``) reads Arrow record batches: a batch stream
        return stream.as_batches() if getattr(source, "batches", False) else stream

    def plan(self) -> JobPlan:
        """Validate the definition and chain forward-connected operators; raises :class:`PipelineError`."""
        validate(self.name, self.parallelism, self.max_parallelism, self.nodes)
        return chain(self.name, self.parallelism, self.max_parallelism, self.nodes)
