"""A job's graph: vertices with their parallelism, and the edges between them with their partitioning."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import (
    Field,
    model_validator,
)

from contract.models.base import (
    MAX_PARALLELISM,
    NAME_PATTERN,
    NAME_RE,
    _Model,
    _range,
)


class Partitioning(str, Enum):
    forward = "forward"
    rebalance = "rebalance"
    hash = "hash"
    broadcast = "broadcast"


class Vertex(_Model):
    id: str = Field(
        json_schema_extra={"pattern": NAME_PATTERN},
        description="Operator id, unique in the job ([A-Za-z0-9_.-], at most 128 characters).",
    )
    name: str | None = Field(default=None, max_length=256, description="Display name; defaults to the id.")
    parallelism: int = Field(
        description="Number of subtasks (at least 1, at most max_parallelism).", **_range(1, MAX_PARALLELISM)
    )
    max_parallelism: int = Field(
        default=128,
        description="Number of key groups; the upper bound for rescaling (at least parallelism).",
        **_range(1, MAX_PARALLELISM),
    )
    kind: Literal["source", "operator", "sink"] = "operator"
    keyed: bool = Field(default=False, description="Whether the vertex keeps keyed state (addressed by key group).")

    @model_validator(mode="after")
    def _bounds(self) -> Vertex:
        if not NAME_RE.match(self.id):
            raise ValueError(f"vertex id {self.id!r} must be 1-128 characters of letters, digits, '_', '.', '-'")
        if not 1 <= self.parallelism <= MAX_PARALLELISM:
            raise ValueError(
                f"vertex {self.id!r} has parallelism {self.parallelism}; it must be at least 1 and at most "
                f"{MAX_PARALLELISM}"
            )
        if not 1 <= self.max_parallelism <= MAX_PARALLELISM:
            raise ValueError(
                f"vertex {self.id!r} has max_parallelism {self.max_parallelism}; the limit is {MAX_PARALLELISM}"
            )
        return self


class Edge(_Model):
    source: str = Field(pattern=NAME_PATTERN, description="Upstream vertex id.")
    target: str = Field(pattern=NAME_PATTERN, description="Downstream vertex id.")
    partitioning: Partitioning = Partitioning.forward


class Graph(_Model):
    vertices: list[Vertex] = Field(min_length=1, max_length=1000)
    edges: list[Edge] = Field(default_factory=list, max_length=10_000)
