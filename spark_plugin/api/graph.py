"""The logical graph a pipeline definition builds: one node per operator, with the edges into it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contract.models import Partitioning
from spark_plugin.api.operators import Operator

Input = tuple["Node", Partitioning, Callable[[Any], Any] | None]
"""An edge into a node: the upstream node, the partitioning, and the key selector of a hash edge."""


@dataclass
class Node:
    """One operator of the logical graph and the edges into and out of it."""

    op: Operator
    inputs: list[Input] = field(default_factory=list)
    outputs: list[Node] = field(default_factory=list)
