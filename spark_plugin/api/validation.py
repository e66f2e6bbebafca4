"""Validation of a pipeline definition before Spark starts: every error names the operator and the fix."""

from __future__ import annotations

from pyspark import cloudpickle

from contract.models import MAX_PARALLELISM, NAME_RE, Partitioning
from spark_plugin.api import operators as ops
from spark_plugin.api.errors import PipelineError
from spark_plugin.api.graph import Node


def _check_picklable(op: ops.Operator) -> None:
    for name, fn in op.functions().items():
        try:
            cloudpickle.dumps(fn)
        except Exception as e:  # noqa: BLE001 - any pickling failure is the user's to fix
            raise PipelineError(
                f"operator {op.id!r}: its {name} cannot be pickled to the Spark tasks ({type(e).__name__}: {e}); "
                "use a module-level function or a lambda that captures only picklable values"
            ) from e


def validate(name: str, parallelism: int, max_parallelism: int, nodes: list[Node]) -> None:
    """Raise :class:`~spark_plugin.api.errors.PipelineError` for the first problem found; fills in each operator's
    parallelism (the pipeline's default where none was given)."""
    if not nodes:
        raise PipelineError(f"pipeline {name!r} has no operators; start with pipeline.source(...)")
    if not isinstance(max_parallelism, int) or isinstance(max_parallelism, bool) or max_parallelism < 1:
        raise PipelineError(f"pipeline {name!r}: max_parallelism {max_parallelism!r} must be a positive integer")
    if max_parallelism > MAX_PARALLELISM:
        raise PipelineError(
            f"pipeline {name!r}: max_parallelism {max_parallelism} is more key groups than the coordinator takes "
            f"(at most {MAX_PARALLELISM})"
        )
    seen: set[str] = set()
    for node in nodes:
        op = node.op
        if not isinstance(op.id, str) or not NAME_RE.match(op.id):
            raise PipelineError(
                f"operator id {op.id!r} must be 1-128 characters of letters, digits, '_', '.', '-'"
            )
        if op.id.startswith("."):
            raise PipelineError(
                f"operator id {op.id!r} must not start with '.': each subtask names its state object in the blob "
                f"store after it ({op.id}-<index>-a<attempt>.state), and the store takes no name that starts with a dot"
            )
        if op.id in seen:
            raise PipelineError(f"operator id {op.id!r} is used twice; give each operator its own id")
        seen.add(op.id)
        par = op.parallelism if op.parallelism is not None else parallelism
        if not isinstance(par, int) or isinstance(par, bool) or par < 1:
            raise PipelineError(f"operator {op.id!r}: parallelism {par!r} must be a positive integer")
        if par > max_parallelism:
            raise PipelineError(
                f"operator {op.id!r}: parallelism {par} exceeds max_parallelism {max_parallelism} "
                "(the number of key groups); raise max_parallelism or lower the parallelism"
            )
        op.parallelism = par
        if isinstance(op, ops.SourceOperator) and node.inputs:
            raise PipelineError(f"source {op.id!r} cannot have inputs")
        if not isinstance(op, ops.SourceOperator) and not node.inputs:
            raise PipelineError(f"operator {op.id!r} has no input; connect it to a source")
        if not isinstance(op, ops.SinkOperator) and not node.outputs:
            raise PipelineError(
                f"operator {op.id!r} has no downstream operator and is not a sink; end the stream with .sink(...)"
            )
        ups = [up.op.id for up, _, _ in node.inputs]
        if len(set(ups)) != len(ups):
            raise PipelineError(f"operator {op.id!r} is connected twice to {ups}; connect it once")
        for up, partitioning, key_fn in node.inputs:
            if partitioning == Partitioning.forward and up.op.parallelism != par:
                raise PipelineError(
                    f"operator {op.id!r} (parallelism {par}) is forward-connected to {up.op.id!r} "
                    f"(parallelism {up.op.parallelism}); forward edges need equal parallelism: "
                    "use .rebalance() or .key_by(...) before it, or equal parallelism"
                )
            if partitioning == Partitioning.hash and not callable(key_fn):
                raise PipelineError(f"operator {op.id!r}: key_by needs a callable key selector, got {key_fn!r}")
        if op.keyed and node.inputs[0][1] != Partitioning.hash:
            raise PipelineError(f"keyed operator {op.id!r} must follow key_by(...)")
        for role, fn in op.functions().items():
            if role in ("source", "sink"):
                continue
            if not callable(fn):
                raise PipelineError(f"operator {op.id!r}: its {role} must be callable, got {fn!r}")
        _check_picklable(op)
        for _up, _, key_fn in node.inputs:
            if key_fn is not None:
                try:
                    cloudpickle.dumps(key_fn)
                except Exception as e:  # noqa: BLE001
                    raise PipelineError(
                        f"operator {op.id!r}: the key selector of its key_by cannot be pickled ({e})"
                    ) from e
