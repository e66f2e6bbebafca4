"""Chaining: forward-connected operators of equal parallelism become one job vertex; the result is the job plan."""

from __future__ import annotations

from contract.models import Partitioning
from spark_plugin.api.graph import Node
from spark_plugin.api.operators import Filter, FlatMap, Map
from spark_plugin.plan.job import JobEdge, JobPlan, JobVertex


def _chainable(up: Node, down: Node) -> bool:
    if len(down.inputs) != 1 or len(up.outputs) != 1:
        return False
    if getattr(down.op, "side", None) is not None:
        return False  # a side output is read over its own edge
    _, partitioning, _ = down.inputs[0]
    return partitioning == Partitioning.forward and up.op.parallelism == down.op.parallelism


def chain(name: str, parallelism: int, max_parallelism: int, nodes: list[Node]) -> JobPlan:
    """The job plan of validated ``nodes`` (given in topological order, as a definition adds them)."""
    head_of: dict[int, Node] = {}
    vertices: dict[str, JobVertex] = {}
    order: list[JobVertex] = []
    for node in nodes:
        if node.inputs and _chainable(node.inputs[0][0], node):
            head = head_of[id(node.inputs[0][0])]
            head_of[id(node)] = head
            vertices[head.op.id].operators.append(node.op)
            continue
        head_of[id(node)] = node
        v = JobVertex(node.op.id, [node.op], node.op.parallelism or parallelism, max_parallelism)
        vertices[v.id] = v
        order.append(v)
        for up, partitioning, key_fn in node.inputs:
            src = vertices[head_of[id(up)].op.id]
            edge = JobEdge(src.id, v.id, partitioning, key_fn, side=getattr(node.op, "side", None))
            src.outputs.append(edge)
            v.inputs.append(edge)
    for v in order:
        if regenerates(v):
            v.outputs[0].regenerated = True
    return JobPlan(name, order)


def regenerates(v: JobVertex) -> bool:
    """Whether the vertex regenerates its output on recovery (``spark_plugin.task.regeneration``): every operator a
    ``map``, ``flat_map`` or ``filter`` declared deterministic (so no source and no state), fed over the network, and
    one output, a hash edge of records (a keyed batch stream's edge cuts batches across key groups)."""
    if not v.inputs or len(v.outputs) != 1:
        return False
    if not all(type(op) in (Map, FlatMap, Filter) and op.deterministic for op in v.operators):
        return False
    edge = v.outputs[0]
    return edge.partitioning == Partitioning.hash and edge.side is None and not callable(
        getattr(edge.key_fn, "split_rows", None)
    )
