"""Building one subtask of a plan: fresh copies of its chain's operators, its channels and its reporters."""

from __future__ import annotations

from pyspark import cloudpickle

from spark_plugin.config import NetworkConfig
from spark_plugin.coordination import CheckpointReporter, CoordinatorEvents
from spark_plugin.pipeline import JobPlan
from spark_plugin.subtask import Subtask
from spark_plugin.topology import TaskSpec


def build_subtask(
    plan: JobPlan,
    spec: TaskSpec,
    reporter: CheckpointReporter,
    events: CoordinatorEvents | None,
    network: NetworkConfig,
    attempt: int | None = None,
    deadline: float | None = None,
    stop_after_checkpoints: int | None = None,
) -> Subtask:
    """A subtask with its own copies of the chain's operators (as a Spark task would unpickle them)."""
    vertex = plan.vertex(spec.vertex)
    operators = cloudpickle.loads(cloudpickle.dumps(vertex.operators))
    edge_keys = [out.edge.key_fn for out in spec.outputs]
    return Subtask(
        spec, operators, edge_keys, reporter, events, network, attempt=attempt, deadline=deadline,
        stop_after_checkpoints=stop_after_checkpoints, final_checkpoint=needs_final_checkpoint(plan),
    )


def needs_final_checkpoint(plan: JobPlan) -> bool:
    """Whether a sink of the plan commits on checkpoints, so sources must end with a final checkpoint."""
    return any(getattr(op, "commits_on_checkpoints", False) for v in plan.vertices for op in v.operators)
