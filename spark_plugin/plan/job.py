"""The job graph: job vertices (chains of forward-connected operators of equal parallelism) and the edges between them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contract.models import Edge, Graph, Partitioning, Vertex


@dataclass
class JobEdge:
    """An edge between two job vertices: the partitioning and, for hash edges, the key selector; ``side`` names the
    side output it carries (e.g. a window's late records) instead of the source vertex's main output."""

    source: str
    target: str
    partitioning: Partitioning
    key_fn: Callable[[Any], Any] | None = None
    side: str | None = None
    regenerated: bool = False
    """Whether the source vertex regenerates what it sent on this edge from its logged inputs on recovery
    (``spark_plugin.task.regeneration``): a last-barrier checkpoint persists none of it on either end."""


@dataclass
class JobVertex:
    """A chain of forward-connected operators of equal parallelism; one subtask of it runs in one Spark task.

    ``operators`` are the pipeline's operator objects (``spark_plugin.api.operators``), head first; the plan reads
    only their ``id``, ``kind``, ``keyed`` and ``commits_on_checkpoints``.
    """

    id: str
    operators: list[Any]
    parallelism: int
    max_parallelism: int
    inputs: list[JobEdge] = field(default_factory=list)
    outputs: list[JobEdge] = field(default_factory=list)

    @property
    def name(self) -> str:
        return " -> ".join(op.id for op in self.operators)

    @property
    def kind(self) -> str:
        if self.operators[0].kind == "source":
            return "source"
        if self.operators[-1].kind == "sink":
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
    def num_subtasks(self) -> int:
        return sum(v.parallelism for v in self.vertices)

    @property
    def commits_on_checkpoints(self) -> bool:
        """Whether a sink of the plan commits on checkpoints, so sources end with a final checkpoint."""
        return any(getattr(op, "commits_on_checkpoints", False) for v in self.vertices for op in v.operators)

    def graph(self) -> Graph:
        """The job graph the coordinator knows: one vertex per chain."""
        return Graph(
            vertices=[
                Vertex(
                    id=v.id,
                    name=v.name,
                    parallelism=v.parallelism,
                    max_parallelism=v.max_parallelism,
                    kind=v.kind,
                    keyed=v.keyed,
                )
                for v in self.vertices
            ],
            edges=[
                Edge(source=e.source, target=e.target, partitioning=e.partitioning)
                for v in self.vertices
                for e in v.outputs
            ],
        )
