"""The pipeline API: sources, transformations, keyed operators and sinks, validated and chained in the driver.

    p = Pipeline("counts", parallelism=2)
    (p.source(SequenceSource(count=10_000, keys=50), id="numbers")
      .key_by(lambda r: r[0])
      .aggregate(lambda: 0, lambda acc, r: acc + 1, id="count")
      .sink(CollectSink(), id="out"))
    result = p.run(spark, coordinator="http://127.0.0.1:8321", checkpoint=CheckpointConfig(interval=1000))

Every definition error (wiring, parallelism, a function that cannot be pickled) raises
:class:`PipelineError` naming the operator, before Spark starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from client.models import NAME_RE
from spark_plugin import operators as ops
from spark_plugin.sinks import Sink
from spark_plugin.sources import Source

if TYPE_CHECKING:
    from spark_plugin.execution import RunResult

PARTITIONINGS = ("forward", "rebalance", "hash", "broadcast")


class PipelineError(ValueError):
    """A pipeline definition that cannot run; the message names the operator and what to change."""


@dataclass
class Node:
    """One operator of the logical graph and the edges into it."""

    op: ops.Operator
    inputs: list[tuple[Node, str, Callable | None]] = field(default_factory=list)
    outputs: list[Node] = field(default_factory=list)


@dataclass
class JobEdge:
    """An edge between two chains: the partitioning and, for hash edges, the key selector."""

    source: str
    target: str
    partitioning: str
    key_fn: Callable | None = None


@dataclass
class JobVertex:
    """A chain of forward-connected operators of equal parallelism; one subtask of it is one Spark task."""

    id: str
    operators: list[ops.Operator]
    parallelism: int
    max_parallelism: int
    inputs: list[JobEdge] = field(default_factory=list)
    outputs: list[JobEdge] = field(default_factory=list)

    @property
    def name(self) -> str:
        return " -> ".join(op.id for op in self.operators)

    @property
    def kind(self) -> str:
        if isinstance(self.operators[0], ops.SourceOperator):
            return "source"
        if isinstance(self.operators[-1], ops.SinkOperator):
            return "sink"
        return "operator"

    @property
    def keyed(self) -> bool:
        return any(op.keyed for op in self.operators)


@dataclass
class JobPlan:
    """The validated, chained pipeline: job vertices in topological order."""

    name: str
    vertices: list[JobVertex]

    def vertex(self, vid: str) -> JobVertex:
        for v in self.vertices:
            if v.id == vid:
                return v
        raise KeyError(vid)

    @property
    def num_tasks(self) -> int:
        return sum(v.parallelism for v in self.vertices)

    def graph(self) -> dict:
        """The job graph for the coordinator (``client.models.Graph`` as a dict): one vertex per chain."""
        return {
            "vertices": [
                {
                    "id": v.id,
                    "name": v.name,
                    "parallelism": v.parallelism,
                    "max_parallelism": v.max_parallelism,
                    "kind": v.kind,
                    "keyed": v.keyed,
                }
                for v in self.vertices
            ],
            "edges": [
                {"source": e.source, "target": e.target, "partitioning": e.partitioning}
                for v in self.vertices
                for e in v.outputs
            ],
        }


class Stream:
    """The output of an operator, with the partitioning that the next operator's input edge will use."""

    def __init__(self, pipeline: Pipeline, node: Node, partitioning: str = "forward", key_fn=None) -> None:
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

    def process(self, fn: Callable, *, id: str | None = None, parallelism: int | None = None) -> Stream:
        """``fn(key, record, state)`` with a :class:`~spark_plugin.state.ValueState` per key; returns outputs."""
        op = ops.Process(self.pipeline._id(id, "process"), self.key_fn, fn, parallelism=parallelism)
        return self._add(op)


class Pipeline:
    """A streaming pipeline definition; ``run`` executes it as one Spark barrier stage."""

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

    def _add_node(self, op: ops.Operator, inputs: list[tuple[Node, str, Callable | None]]) -> Node:
        node = Node(op, inputs)
        for up, _, _ in inputs:
            up.outputs.append(node)
        self.nodes.append(node)
        return node

    def source(
        self, source: Source, *, id: str | None = None, parallelism: int | None = None
    ) -> Stream:
        """Add a source; the returned stream forwards to the next operator."""
        op = ops.SourceOperator(self._id(id, "source"), source, parallelism=parallelism)
        return Stream(self, self._add_node(op, []))

    # ------------------------------------------------------------------------------------------ validation

    def plan(self) -> JobPlan:
        """Validate the definition and chain forward-connected operators; raises :class:`PipelineError`."""
        from spark_plugin.validation import validate

        validate(self)
        return _chain(self)

    def run(self, spark: Any, coordinator: str, **kwargs: Any) -> RunResult:
        """Run on Spark as one barrier stage; see :func:`spark_plugin.execution.run_pipeline`.

        With ``restart=`` (a :mod:`spark_plugin.restart` strategy such as ``FixedDelay(max_restarts=3)``) a
        :class:`~spark_plugin.supervisor.Supervisor` restarts a failed barrier stage from the latest checkpoint.
        """
        from spark_plugin.execution import run_pipeline

        restart = kwargs.pop("restart", None)
        if restart is not None:
            from spark_plugin.supervisor import Supervisor

            return Supervisor(self, restart).run(spark, coordinator, **kwargs)  # type: ignore[return-value]
        return run_pipeline(self, spark, coordinator, **kwargs)


def _chainable(up: Node, down: Node) -> bool:
    if len(down.inputs) != 1 or len(up.outputs) != 1:
        return False
    _, partitioning, _ = down.inputs[0]
    return partitioning == "forward" and up.op.parallelism == down.op.parallelism


def _chain(p: Pipeline) -> JobPlan:
    head_of: dict[int, Node] = {}
    vertices: dict[str, JobVertex] = {}
    order: list[JobVertex] = []
    for node in p.nodes:  # nodes are added in topological order
        if node.inputs and _chainable(node.inputs[0][0], node):
            head = head_of[id(node.inputs[0][0])]
            head_of[id(node)] = head
            vertices[head.op.id].operators.append(node.op)
            continue
        head_of[id(node)] = node
        v = JobVertex(node.op.id, [node.op], node.op.parallelism or p.parallelism, p.max_parallelism)
        vertices[v.id] = v
        order.append(v)
        for up, partitioning, key_fn in node.inputs:
            src = vertices[head_of[id(up)].op.id]
            edge = JobEdge(src.id, v.id, partitioning, key_fn)
            src.outputs.append(edge)
            v.inputs.append(edge)
    return JobPlan(p.name, order)
