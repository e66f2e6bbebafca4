"""Channels of a job plan: which input and output channels each subtask has, with stable names and indices."""

from __future__ import annotations

from dataclasses import dataclass

from contract.models import Partitioning
from spark_plugin.plan.job import JobEdge, JobPlan


@dataclass(frozen=True)
class ChannelInfo:
    """What a channel's end knows of the channel; also what its channel-state segment says about it."""

    name: str
    direction: str  # "input" | "output"
    peer_vertex: str | None = None
    peer_subtask: int | None = None
    partitioning: Partitioning | None = None


def channel_key(up_vertex: str, up_index: int, down_vertex: str, down_index: int) -> str:
    """The name both ends use for one channel, e.g. ``map[0]->reduce[1]``."""
    return f"{up_vertex}[{up_index}]->{down_vertex}[{down_index}]"


@dataclass
class InputChannelSpec:
    info: ChannelInfo
    key: str
    upstream_subtask: int
    """The position of the upstream subtask in the plan's subtask order (its Spark partition)."""
    regenerated: bool = False
    """The upstream regenerates what it sends here (``JobEdge.regenerated``)."""


@dataclass
class OutputEdgeSpec:
    edge: JobEdge
    target_parallelism: int
    target_max_parallelism: int
    channels: list[ChannelInfo]
    keys: list[str]


@dataclass
class SubtaskSpec:
    """One subtask of one job vertex (a chain) with its channels; ``position`` is its Spark partition."""

    position: int
    vertex: str
    subtask_index: int
    parallelism: int
    max_parallelism: int
    inputs: list[InputChannelSpec]
    outputs: list[OutputEdgeSpec]

    @property
    def name(self) -> str:
        return f"{self.vertex}[{self.subtask_index}]"


def _peers(partitioning: Partitioning, index: int, peer_parallelism: int) -> list[int]:
    if partitioning == Partitioning.forward:
        return [index]
    return list(range(peer_parallelism))


def subtask_specs(plan: JobPlan) -> list[SubtaskSpec]:
    """Every subtask of the plan, in order (vertex by vertex, subtask by subtask): one Spark task each."""
    position_of: dict[tuple[str, int], int] = {}
    order: list[tuple] = []
    for v in plan.vertices:
        for i in range(v.parallelism):
            position_of[(v.id, i)] = len(order)
            order.append((v, i))
    specs = []
    for t, (v, i) in enumerate(order):
        inputs = []
        for e in v.inputs:
            up = plan.vertex(e.source)
            for j in _peers(e.partitioning, i, up.parallelism):
                key = channel_key(up.id, j, v.id, i)
                info = ChannelInfo(f"in:{key}", "input", up.id, j, e.partitioning)
                inputs.append(InputChannelSpec(info, key, position_of[(up.id, j)], e.regenerated))
        outputs = []
        for e in v.outputs:
            down = plan.vertex(e.target)
            peers = _peers(e.partitioning, i, down.parallelism)
            keys = [channel_key(v.id, i, down.id, j) for j in peers]
            infos = [
                ChannelInfo(f"out:{k}", "output", down.id, j, e.partitioning) for k, j in zip(keys, peers, strict=True)
            ]
            outputs.append(OutputEdgeSpec(e, down.parallelism, down.max_parallelism, infos, keys))
        specs.append(SubtaskSpec(t, v.id, i, v.parallelism, v.max_parallelism, inputs, outputs))
    return specs
