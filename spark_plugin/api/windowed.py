"""The event-time part of the pipeline API: a keyed stream's windows and what they compute, keyed process functions
with timers, and the late records of a window.

    windowed = (
        p.source(events, id="events", watermarks=WatermarkStrategy.for_bounded_out_of_orderness(2_000, ts))
        .key_by(lambda r: r[0])
        .window(TumblingEventTimeWindows.of(10_000), allowed_lateness=5_000)
        .aggregate(lambda: 0, lambda n, r: n + 1, merge=operator.add, id="counts")
    )
    windowed.sink(counts_sink, id="out")                        # (key, start, end, count)
    windowed.late_records().sink(late_sink, id="late")          # the records too late for their windows

The record's event time is the source's ``timestamp`` function as long as only filters (and ``key_by``) come after
the source; after anything that may change the record, name it with ``timestamp=``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spark_plugin.api import operators as ops
from spark_plugin.api.batch_sessions import KeyedBatchSessionAggregate
from spark_plugin.api.batch_windows import KeyedBatchWindowAggregate
from spark_plugin.api.errors import PipelineError
from spark_plugin.api.graph import Node
from spark_plugin.api.timers import KeyedProcessFunction, TimedProcess
from spark_plugin.api.watermarks import WatermarkStrategy
from spark_plugin.api.windows import (
    AggregateFunction,
    ProcessWindowFunction,
    ReduceFunction,
    SideOutput,
    WindowAssigner,
    WindowFunction,
    WindowOperator,
    late_tag,
)

KeyedStream = Any  # spark_plugin.api.pipeline.KeyedStream (which imports this module)
Stream = Any  # spark_plugin.api.pipeline.Stream

def source_strategy(node: Node) -> WatermarkStrategy | None:
    """The watermark strategy of the source upstream of ``node`` (None when it has none)."""
    while node.inputs:
        node = node.inputs[0][0]
    return getattr(node.op, "watermarks", None)


def inherited_timestamp(node: Node) -> Callable[[Any], int] | None:
    """The source's timestamp function, if the records reaching past ``node`` are still the source's records
    (only filters in between)."""
    while node.inputs:
        if not isinstance(node.op, ops.Filter):
            return None
        node = node.inputs[0][0]
    strategy = getattr(node.op, "watermarks", None)
    return strategy.timestamp if strategy is not None else None


def check_strategy(watermarks: Any, source_id: str) -> None:
    if watermarks is not None and not isinstance(watermarks, WatermarkStrategy):
        raise PipelineError(
            f"source {source_id!r}: watermarks must be a WatermarkStrategy, got {watermarks!r}; e.g. "
            "WatermarkStrategy.for_bounded_out_of_orderness(2_000, timestamp=lambda r: r[1])"
        )


def _timestamp(keyed: KeyedStream, given: Callable[[Any], int] | None, what: str) -> Callable[[Any], int]:
    if given is not None:
        if not callable(given):
            raise PipelineError(f"{what}: timestamp must be a function of the record, got {given!r}")
        return given
    inherited = inherited_timestamp(keyed.node)
    if inherited is None:
        raise PipelineError(
            f"{what}: the records are not known to carry the source's event time after {keyed.node.op.id!r} "
            "(it may change them); name it with timestamp=lambda r: ..."
        )
    return inherited


class WindowedStream:
    """A keyed stream cut into event-time windows; ``reduce``, ``aggregate`` or ``process`` says what each window
    computes and returns its results as a stream, whose ``late_records()`` is the window's side output."""

    def __init__(self, keyed: KeyedStream, assigner: WindowAssigner, allowed_lateness: int,
                 timestamp: Callable[[Any], int] | None) -> None:
        if not isinstance(assigner, WindowAssigner):
            raise PipelineError(
                f"window() needs a window assigner such as TumblingEventTimeWindows.of(10_000), got {assigner!r}"
            )
        if not isinstance(allowed_lateness, int) or allowed_lateness < 0:
            raise PipelineError(f"allowed_lateness must be a non-negative number of ms, got {allowed_lateness!r}")
        if source_strategy(keyed.node) is None:
            raise PipelineError(
                f"window {assigner!r} after {keyed.node.op.id!r}: its source has no watermarks, so its windows "
                "would fire only when the input ends; give the source watermarks=WatermarkStrategy...."
            )
        self.keyed = keyed
        self.assigner = assigner
        self.allowed_lateness = allowed_lateness
        self.timestamp = timestamp

    def _add(self, kind: str, function: WindowFunction, id: str | None, parallelism: int | None) -> Stream:
        op_id = self.keyed.pipeline._id(id, kind)
        op = WindowOperator(
            op_id, self.keyed.key_fn, self.assigner, function,
            _timestamp(self.keyed, self.timestamp, f"window operator {op_id!r}"), self.allowed_lateness,
            parallelism=parallelism,
        )
        return self.keyed._add(op)

    def reduce(self, fn: Callable[[Any, Any], Any], *, id: str | None = None,
               parallelism: int | None = None) -> Stream:
        """Each window reduces its records with ``fn``; emits ``(key, start, end, reduced)``."""
        return self._add("window-reduce", ReduceFunction(fn), id, parallelism)

    def aggregate(self, zero: Callable[[], Any], add: Callable[[Any, Any], Any], *,
                  merge: Callable[[Any, Any], Any] | None = None, result: Callable[[Any], Any] | None = None,
                  id: str | None = None, parallelism: int | None = None) -> Stream:
        """Each window folds its records into ``add(acc, record)`` from ``zero()``; emits ``(key, start, end,
        result(acc))``. Session windows merge accumulators with ``merge(a, b)``."""
        if self.assigner.merging and merge is None:
            raise PipelineError(
                f"aggregate over {self.assigner!r}: session windows merge, so they need merge=lambda a, b: ..."
            )
        return self._add("window-aggregate", AggregateFunction(zero, add, merge, result), id, parallelism)

    def process(self, fn: Callable, *, id: str | None = None, parallelism: int | None = None) -> Stream:
        """``fn(key, window, records)`` sees all of a window's records when it fires; returns its outputs."""
        return self._add("window-process", ProcessWindowFunction(fn), id, parallelism)


def timed_process(keyed: KeyedStream, fn: KeyedProcessFunction, op_id: str,
                  timestamp: Callable[[Any], int] | None, parallelism: int | None) -> ops.Operator:
    """The operator of ``key_by(...).process(KeyedProcessFunction)``; the record's timestamp is optional there."""
    ts = timestamp if timestamp is not None else inherited_timestamp(keyed.node)
    return TimedProcess(op_id, keyed.key_fn, fn, ts, parallelism=parallelism)


def late_records_operator(node: Node, op_id: str) -> SideOutput:
    """The operator reading the late records of the window operator at ``node``."""
    if not isinstance(node.op, (WindowOperator, KeyedBatchWindowAggregate, KeyedBatchSessionAggregate)):
        raise PipelineError(
            f"late_records() follows a window's results (window(...).reduce/aggregate/process), not "
            f"{node.op.id!r}"
        )
    if any(isinstance(down.op, SideOutput) for down in node.outputs):
        raise PipelineError(f"the late records of {node.op.id!r} are read once; reuse the stream late_records() gave")
    return SideOutput(op_id, late_tag(node.op.id), parallelism=node.op.parallelism)

