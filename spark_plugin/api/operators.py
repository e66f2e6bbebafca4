"""The operators of a pipeline: stateless transformations, keyed operators with state, and the sink wrapper.

An operator is defined in the driver and pickled into every Spark task; ``open`` prepares one subtask's copy.
``bind(out)`` returns the function that processes one record and passes results to ``out``, so a chain of
operators is a chain of plain calls with no per-record dispatch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contract.keygroups import KEY_HASH_VERSION, key_group_range
from spark_plugin.api.state import KeyedState, ValueState
from spark_plugin.connectors.base import Sink, Source
from spark_plugin.connectors.subtask_splits import as_partitioned

Emit = Callable[[Any], None]


class Operator:
    """Base class: one vertex of the pipeline graph."""

    kind = "operator"
    keyed = False

    def __init__(self, id: str, parallelism: int | None = None, max_parallelism: int | None = None) -> None:
        self.id = id
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.subtask_index = 0

    def functions(self) -> dict[str, Any]:
        """User functions of this operator, checked for picklability before Spark starts."""
        return {}

    def open(self, subtask_index: int, parallelism: int, max_parallelism: int) -> None:
        self.subtask_index = subtask_index

    def bind(self, out: Emit) -> Emit:
        raise NotImplementedError

    def snapshot(self, checkpoint_id: int) -> Any:
        """Operator state to persist for checkpoint ``checkpoint_id`` (None: stateless)."""
        return None

    def restore(self, state: Any) -> None:
        """Load this subtask's part of a snapshot (for keyed state: the key groups in its range)."""

    def rewind(self, job_id: int, checkpoint_id: int | None) -> None:
        """A new attempt of job ``job_id`` starts from ``checkpoint_id`` (None: from scratch); before ``restore``."""

    def uncommitted(self) -> bool:
        """Whether this operator holds output that waits for a checkpoint to complete (sinks)."""
        return False

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed (sinks commit here)."""

    def close(self) -> Any:
        """Called when the subtask ends; a sink returns what the driver should receive."""
        return None

    def release(self) -> None:
        """Free what the operator holds outside Python (broker connections, consumers, producers). Called when the
        subtask's channels close, after a failure as after ``close``: it commits and returns nothing, and a second
        call does nothing."""


class FunctionOperator(Operator):
    """A stateless operator around one user function ``fn``.

    ``deterministic``: the user's promise that ``fn`` gives the same outputs, in the same order, whenever it is
    called with the same input, and keeps nothing between calls. A chain of such operators may then regenerate its
    outputs on recovery instead of persisting them (``spark_plugin.task.regeneration``)."""

    def __init__(self, id: str, fn: Callable[[Any], Any], deterministic: bool = False, **kw: Any) -> None:
        super().__init__(id, **kw)
        self.fn = fn
        self.deterministic = deterministic

    def functions(self) -> dict[str, Any]:
        return {"fn": self.fn}


class Map(FunctionOperator):
    """One output record per input record."""

    def bind(self, out: Emit) -> Emit:
        fn = self.fn
        return lambda r: out(fn(r))


class FlatMap(FunctionOperator):
    """Any number of output records (an iterable) per input record."""

    def bind(self, out: Emit) -> Emit:
        fn = self.fn

        def process(r: Any) -> None:
            for x in fn(r):
                out(x)

        return process


class Filter(FunctionOperator):
    """The records for which ``fn`` is true."""

    def bind(self, out: Emit) -> Emit:
        fn = self.fn

        def process(r: Any) -> None:
            if fn(r):
                out(r)

        return process


class KeyedOperator(Operator):
    """An operator after ``key_by``: its state is addressed by key group."""

    keyed = True
    moves_rehashed_keys = True
    """Whether a restore of state keyed by an older key hash may move a key to its new key group."""
    restored_key_hash = KEY_HASH_VERSION
    """The key hash of the checkpoint this operator restored (records in flight in it were routed by that hash)."""

    def __init__(self, id: str, key_fn: Callable[[Any], Any], **kw: Any) -> None:
        super().__init__(id, **kw)
        self.key_fn = key_fn
        self.state: KeyedState | None = None

    def functions(self) -> dict[str, Any]:
        return {"key": self.key_fn}

    def open(self, subtask_index: int, parallelism: int, max_parallelism: int) -> None:
        super().open(subtask_index, parallelism, max_parallelism)
        self.state = KeyedState(max_parallelism, key_group_range(subtask_index, max_parallelism, parallelism))

    def snapshot(self, checkpoint_id: int) -> Any:
        assert self.state is not None
        return {"keyed": self.state.snapshot(), "key_hash": KEY_HASH_VERSION}

    def restore(self, state: Any) -> None:
        assert self.state is not None
        if state:
            self.restored_key_hash = state.get("key_hash", 1)  # a snapshot without one is of version 1
            self.state.restore(state["keyed"], self.restored_key_hash, self.moves_rehashed_keys)


class KeyedFunctionOperator(KeyedOperator):
    """A keyed operator around one user function ``fn``."""

    def __init__(self, id: str, key_fn: Callable, fn: Callable, **kw: Any) -> None:
        super().__init__(id, key_fn, **kw)
        self.fn = fn

    def functions(self) -> dict[str, Any]:
        return {**super().functions(), "fn": self.fn}


class Reduce(KeyedFunctionOperator):
    """Rolling reduce per key: emits the new reduced value after every record (``fn(old, record)``)."""

    def bind(self, out: Emit) -> Emit:
        key_fn, fn, state = self.key_fn, self.fn, self.state
        assert state is not None
        missing = object()

        def process(r: Any) -> None:
            k = key_fn(r)
            old = state.get(k, missing)
            new = r if old is missing else fn(old, r)
            state.put(k, new)
            out(new)

        return process


class Aggregate(KeyedOperator):
    """Rolling aggregate per key: ``acc = add(acc, record)`` starting from ``zero()``; emits ``(key, acc)``."""

    def __init__(self, id: str, key_fn: Callable, zero: Callable[[], Any], add: Callable, **kw: Any) -> None:
        super().__init__(id, key_fn, **kw)
        self.zero = zero
        self.add = add

    def functions(self) -> dict[str, Any]:
        return {**super().functions(), "zero": self.zero, "add": self.add}

    def bind(self, out: Emit) -> Emit:
        key_fn, zero, add, state = self.key_fn, self.zero, self.add, self.state
        assert state is not None

        def process(r: Any) -> None:
            k = key_fn(r)
            acc = state.get(k)
            acc = add(zero() if acc is None else acc, r)
            state.put(k, acc)
            out((k, acc))

        return process


class Process(KeyedFunctionOperator):
    """A keyed process function ``fn(key, record, state: ValueState)`` returning an iterable of outputs or None."""

    def bind(self, out: Emit) -> Emit:
        key_fn, fn, state = self.key_fn, self.fn, self.state
        assert state is not None
        value = ValueState(state)

        def process(r: Any) -> None:
            k = key_fn(r)
            value._key = k
            result = fn(k, r, value)
            if result is not None:
                for x in result:
                    out(x)

        return process


class ConnectorOperator(Operator):
    """An operator around a connector (a source or a sink), opened and closed with its subtask."""

    role = "connector"

    def __init__(self, id: str, connector: Any, **kw: Any) -> None:
        super().__init__(id, **kw)
        self.connector = connector

    def functions(self) -> dict[str, Any]:
        return {self.role: self.connector}

    def open(self, subtask_index: int, parallelism: int, max_parallelism: int) -> None:
        super().open(subtask_index, parallelism, max_parallelism)
        self.connector.open(subtask_index, parallelism)

    def close(self) -> Any:
        return self.connector.close()

    def release(self) -> None:
        release = getattr(self.connector, "release", None)  # connectors written before release() existed have none
        if release is not None:
            release()


class SinkOperator(ConnectorOperator):
    """Hands records to a :class:`~spark_plugin.connectors.base.Sink`."""

    kind = role = "sink"

    def __init__(self, id: str, sink: Sink, **kw: Any) -> None:
        super().__init__(id, sink, **kw)

    @property
    def sink(self) -> Sink:
        return self.connector

    def bind(self, out: Emit) -> Emit:
        return self.sink.write

    def snapshot(self, checkpoint_id: int) -> Any:
        return self.sink.snapshot(checkpoint_id)

    def rewind(self, job_id: int, checkpoint_id: int | None) -> None:
        self.sink.rewind(job_id, checkpoint_id)

    def attempt_over(self, reason: str) -> None:
        self.sink.attempt_over(reason)

    def restore(self, state: Any) -> None:
        if state is not None:
            self.sink.restore(state)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.sink.notify_checkpoint_complete(checkpoint_id)

    def uncommitted(self) -> bool:
        return self.sink.uncommitted()

    @property
    def commits_on_checkpoints(self) -> bool:
        return self.sink.commits_on_checkpoints


class SourceOperator(ConnectorOperator):
    """Wraps a :class:`~spark_plugin.connectors.base.Source`; the head of its chain."""

    kind = role = "source"
    watermarks: Any = None
    """The source's ``WatermarkStrategy`` (``spark_plugin.api.watermarks``) when its records carry event time."""

    def __init__(self, id: str, source: Source, **kw: Any) -> None:
        # an older Source without splits of its own is read as one split per subtask, so it rescales too
        super().__init__(id, as_partitioned(source), **kw)

    def functions(self) -> dict[str, Any]:
        fns = super().functions()
        if self.watermarks is not None:
            fns["timestamp"] = self.watermarks.timestamp
        return fns

    @property
    def source(self) -> Source:
        return self.connector

    def bind(self, out: Emit) -> Emit:
        return out

    def snapshot(self, checkpoint_id: int) -> Any:
        self.source.snapshot_started(checkpoint_id)  # the source's offsets are taken right after the chain's state
        return None

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.source.notify_checkpoint_complete(checkpoint_id)
