"""Channels of a job plan: which input and output channels each subtask has, with stable names and indices."""

from __future__ import annotations

from dataclasses import dataclass

from spark_plugin.channel_state import ChannelInfo
from spark_plugin.pipeline import JobEdge, JobPlan


def channel_key(up_vertex: str, up_index: int, down_vertex: str, down_index: int) -> str:
    """The name both ends use for one channel, e.g. ``map[0]->reduce[1]``."""
    return f"{up_vertex}[{up_index}]->{down_vertex}[{down_index}]"


@dataclass
class InputChannelSpec:
    info: ChannelInfo
    key: str
    upstream_task: int


@dataclass
class OutputEdgeSpec:
    edge: JobEdge
    target_parallelism: int
    target_max_parallelism: int
    channels: list[ChannelInfo]
    keys: list[str]


@dataclass
class TaskSpec:
    """One Spark task: one subtask of one job vertex (a chain), with its channels."""

    task_index: int
    vertex: str
    subtask_index: int
    parallelism: int
    max_parallelism: int
    inputs: list[InputChannelSpec]
    outputs: list[OutputEdgeSpec]


def _peers(partitioning: str, index: int, peer_parallelism: int) -> list[int]:
    if partitioning == "forward":
        return [index]
    return list(range(peer_parallelism))


def task_specs(plan: JobPlan) -> list[TaskSpec]:
    """Every subtask of the plan, in task order (vertex by vertex, subtask by subtask)."""
    task_of: dict[tuple[str, int], int] = {}
    order: list[tuple] = []
    for v in plan.vertices:
        for i in range(v.parallelism):
            task_of[(v.id, i)] = len(order)
            order.append((v, i))
    specs = []
    for t, (v, i) in enumerate(order):
        inputs = []
        for e in v.inputs:
            up = plan.vertex(e.source)
            for j in _peers(e.partitioning, i, up.parallelism):
                key = channel_key(up.id, j, v.id, i)
                info = ChannelInfo(f"in:{key}", "input", up.id, j, e.partitioning)
                inputs.append(InputChannelSpec(info, key, task_of[(up.id, j)]))
        outputs = []
        for e in v.outputs:
            down = plan.vertex(e.target)
            keys = [channel_key(v.id, i, down.id, j) for j in _peers(e.partitioning, i, down.parallelism)]
            peers = _peers(e.partitioning, i, down.parallelism)
            infos = [ChannelInfo(f"out:{k}", "output", down.id, j, e.partitioning) for k, j in zip(keys, peers, strict=True)]
            outputs.append(OutputEdgeSpec(e, down.parallelism, down.max_parallelism, infos, keys))
        specs.append(TaskSpec(t, v.id, i, v.parallelism, v.max_parallelism, inputs, outputs))
    return specs
