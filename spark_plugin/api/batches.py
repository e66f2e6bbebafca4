"""Vectorized operators: user functions over Arrow record batches (or pandas DataFrames, as ``mapInPandas`` takes
them), the split of a batch stream by target subtask for ``key_by("column")``, and keyed aggregates updated a batch
at a time.

A batch stream carries ``pyarrow.RecordBatch`` records: each batch is one record to the runtime (one barrier never
splits it; channel state holds it whole), so every checkpoint, restore and rescale rule of the record path holds for
batches unchanged.

**Keyed batches.** ``key_by("column")`` sends each batch as a :class:`SubtaskBatch`, and the hash edge splits it,
vectorized, into one sub-batch per target subtask (at most the downstream parallelism of them), each holding the
rows of every key group that subtask owns, rows of a key in their order. The edge assigns key groups to subtasks
as it does for records (:func:`contract.keygroups.operator_index`), through :data:`route_key`'s ``split_rows``; a
restore that re-routes channel state after a rescale splits a sub-batch again the same way. The keyed operator groups a
sub-batch by key once and keeps each key's state in the key's key group, which its subtask must own (a row of a
key group it does not own fails the subtask; its state is never put elsewhere). Key groups come from
:func:`contract.keygroups.key_group` of each distinct key's Python value, the function the record path uses, so a
key has the same key group (and state) whether it came as a record or in a batch; the cost is one Python call per
distinct key of a batch, not per row.

A checkpoint taken before this split holds :class:`KeyedBatch` records (the rows of one key group each); they are
still routed, restored and aggregated.

**On the wire and in channel state** a batch is an Arrow IPC stream, not a pickle (``contract.record_codec``): a
persisted segment of a batch edge opens with pyarrow or DuckDB, and the UI previews it without unpickling.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from contract.keygroups import key_group
from contract.record_codec import KeyedBatch, SubtaskBatch
from spark_plugin.api.errors import PipelineError
from spark_plugin.api.operators import Emit, FunctionOperator, KeyedOperator, Operator

FORMATS = ("arrow", "pandas")
AGGREGATES = ("sum", "count", "min", "max", "mean")


def split_by_owner(record: Any, max_parallelism: int, owner: Callable[[int], Any]) -> list[tuple[Any, Any]]:
    """``record``'s rows by ``owner(key group)`` of their keys: ``(owner, part)`` for each owner that has rows,
    rows kept in their order. A :class:`KeyedBatch` (one key group) goes whole to the owner of its key's group."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(record, KeyedBatch):
        return [(owner(key_group(record.key, max_parallelism)), record)]
    batch = record.batch
    if batch.num_rows == 0:
        return []
    encoded = pc.dictionary_encode(batch.column(record.column), null_encoding="encode")
    distinct = encoded.dictionary.to_pylist()
    owners = [owner(key_group(k, max_parallelism)) for k in distinct]
    if len(set(owners)) == 1:
        return [(owners[0], record)]
    labels = {o: i for i, o in enumerate(dict.fromkeys(owners))}
    label_of_distinct = np.fromiter((labels[o] for o in owners), dtype=np.int64, count=len(owners))
    indices = encoded.indices.to_numpy(zero_copy_only=False)
    per_row = label_of_distinct[indices]
    order = np.argsort(per_row, kind="stable")  # stable: a key's rows keep their order
    sorted_labels = per_row[order]
    bounds = np.flatnonzero(np.diff(sorted_labels)) + 1
    taken = batch.take(pa.array(order))
    by_label = list(labels)
    out = []
    start = 0
    for end in [*bounds.tolist(), len(order)]:
        first = int(indices[int(order[start])])
        out.append((by_label[int(sorted_labels[start])],
                    SubtaskBatch(distinct[first], record.column, taken.slice(start, end - start))))
        start = end
    return out


class RouteKey:
    """The key selector of a keyed batch edge. Called on a record it gives the key the edge routes by (the first
    row's); its :meth:`split_rows` cuts a record into the parts of each owner, which the edge and a rescaled restore use
    instead, so no row goes to a subtask that does not own its key group."""

    def __call__(self, record: Any) -> Any:
        return record.key

    def split_rows(self, record: Any, max_parallelism: int, owner: Callable[[int], Any]) -> list[tuple[Any, Any]]:
        return split_by_owner(record, max_parallelism, owner)

    def __reduce__(self) -> str:
        return "route_key"  # one instance: pickled by reference


route_key = RouteKey()
"""How a hash edge routes :class:`SubtaskBatch` and :class:`KeyedBatch` records."""


def check_format(format: str, what: str) -> None:
    if format not in FORMATS:
        raise PipelineError(f"{what}: format {format!r} is not one of {', '.join(FORMATS)}")


def record_batches(x: Any) -> list[Any]:
    """What a user function returned, as record batches: a ``RecordBatch``, a ``Table``, a pandas ``DataFrame``, a
    dict of columns or a list of row dicts; None is no batch."""
    import pyarrow as pa

    if x is None:
        return []
    if isinstance(x, pa.RecordBatch):
        return [x]
    if isinstance(x, pa.Table):
        return x.combine_chunks().to_batches()
    if isinstance(x, dict):
        return [pa.RecordBatch.from_pydict(x)]
    if isinstance(x, list):
        return [pa.RecordBatch.from_pylist(x)] if x else []
    if type(x).__name__ == "DataFrame":
        return [pa.RecordBatch.from_pandas(x, preserve_index=False)]
    raise TypeError(
        f"a batch function returned {type(x).__name__}; return a pyarrow.RecordBatch or Table, a pandas DataFrame, "
        "a dict of columns or a list of row dicts"
    )


def _view(format: str) -> Callable[[Any], Any]:
    """How a user function sees a batch: the ``RecordBatch`` itself, or a pandas ``DataFrame``."""
    if format == "pandas":
        return lambda b: b.to_pandas()
    return lambda b: b


class MapBatches(FunctionOperator):
    """``fn(batch)`` returns the batch (or batches) to send on, as :func:`record_batches` takes them; empty ones
    are dropped."""

    kind = "map_batches"

    def __init__(self, id: str, fn: Callable[[Any], Any], format: str = "arrow", **kw: Any) -> None:
        check_format(format, f"map_batches {id!r}")
        super().__init__(id, fn, **kw)
        self.format = format

    def bind(self, out: Emit) -> Emit:
        fn, view = self.fn, _view(self.format)

        def process(b: Any) -> None:
            for x in record_batches(fn(view(b))):
                if x.num_rows:
                    out(x)

        return process


class FlatMapBatches(MapBatches):
    """``fn(batch)`` returns an iterable of batches (each as :func:`record_batches` takes it)."""

    kind = "flat_map_batches"

    def bind(self, out: Emit) -> Emit:
        fn, view = self.fn, _view(self.format)

        def process(b: Any) -> None:
            for item in fn(view(b)) or ():
                for x in record_batches(item):
                    if x.num_rows:
                        out(x)

        return process


class FilterBatches(MapBatches):
    """``fn(batch)`` returns a boolean mask (an Arrow array, a NumPy array, a pandas Series or a list), one entry
    per row; the rows where it is true go on, as one batch."""

    kind = "filter_batches"

    def bind(self, out: Emit) -> Emit:
        import pyarrow as pa

        fn, view = self.fn, _view(self.format)

        def process(b: Any) -> None:
            mask = fn(view(b))
            if not isinstance(mask, (pa.Array, pa.ChunkedArray)):
                mask = pa.array(mask, type=pa.bool_())
            if len(mask) != b.num_rows:
                raise ValueError(f"the filter's mask has {len(mask)} entries for a batch of {b.num_rows} rows")
            kept = b.filter(mask)
            if kept.num_rows:
                out(kept)

        return process


class BatchRows(Operator):
    """A batch stream into a record stream: one dict per row."""

    kind = "batch_rows"

    def bind(self, out: Emit) -> Emit:
        def process(b: Any) -> None:
            for row in b.to_pylist():
                out(row)

        return process


def split_by_key_group(batch: Any, column: str, max_parallelism: int) -> Iterable[KeyedBatch]:
    """``batch``'s rows by the key group of their ``column`` value, each group's rows in their order (the split
    ``key_by`` made before :class:`SubtaskBatch`)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if batch.num_rows == 0:
        return []
    keys = batch.column(column)
    encoded = pc.dictionary_encode(keys, null_encoding="encode")
    distinct = encoded.dictionary.to_pylist()
    groups_of_distinct = np.fromiter((key_group(k, max_parallelism) for k in distinct), dtype=np.int64,
                                     count=len(distinct))
    indices = encoded.indices.to_numpy(zero_copy_only=False)
    groups = groups_of_distinct[indices]
    if len(distinct) == 1 or (groups == groups[0]).all():
        return [KeyedBatch(distinct[int(indices[0])], int(groups[0]), batch)]
    order = np.argsort(groups, kind="stable")  # stable: a key's rows keep their order
    sorted_groups = groups[order]
    bounds = np.flatnonzero(np.diff(sorted_groups)) + 1
    taken = batch.take(pa.array(order))
    out = []
    start = 0
    for end in [*bounds.tolist(), len(order)]:
        first_row = int(order[start])
        out.append(KeyedBatch(distinct[int(indices[first_row])], int(sorted_groups[start]),
                              taken.slice(start, end - start)))
        start = end
    return out


class SplitByKeyGroup(Operator):
    """Chained before a keyed batch edge: each batch as one :class:`SubtaskBatch`, which the edge splits by target
    subtask (the name and kind are those of the operator that split by key group, so older plans and checkpoints
    match)."""

    kind = "split_by_key_group"

    def __init__(self, id: str, column: str, **kw: Any) -> None:
        super().__init__(id, **kw)
        self.column = column

    def bind(self, out: Emit) -> Emit:
        column = self.column

        def process(b: Any) -> None:
            if column not in b.schema.names:
                raise KeyError(f"key_by({column!r}): the batch has no column {column!r} (it has {b.schema.names})")
            if b.num_rows:
                out(SubtaskBatch(b.column(column)[0].as_py(), column, b))

        return process


def key_groups_of(keys: list[Any], max_parallelism: int, own: tuple[int, int], what: str) -> list[int]:
    """The key group of each key, all of which must lie in ``own`` (the subtask's key groups): a row of another
    key group reached this subtask, and its state must not be put here, so the subtask fails instead."""
    start, end = own
    groups = [key_group(k, max_parallelism) for k in keys]
    for k, g in zip(keys, groups, strict=True):
        if not start <= g <= end:
            raise RuntimeError(
                f"{what}: a batch row with key {k!r} (key group {g}) reached the subtask of key groups "
                f"{start}..{end}; its state belongs to another subtask. This happens with sub-batches in flight "
                "in a checkpoint of an older key hash: restore it with the keyed stage at parallelism 1 "
                "(docs/recovery.md, \"Key groups and key hashing\")"
            )
    return groups


def partial_aggregates(fns: Iterable[str]) -> list[str]:
    """The pyarrow aggregations that running ``fns`` needs (a mean is kept as a sum and a count)."""
    need: list[str] = []
    for f in fns:
        for p in (("sum", "count") if f == "mean" else (f,)):
            if p not in need:
                need.append(p)
    return need


def merge_partial(fn: str, old: Any, new: Any) -> Any:
    if old is None:
        return new
    if new is None:
        return old
    if fn in ("sum", "count"):
        return old + new
    if fn == "min":
        return min(old, new)
    return max(old, new)


class KeyedBatchAggregate(KeyedOperator):
    """Running aggregates per key of a keyed batch stream, updated a batch at a time: ``aggs`` maps a column to
    one or several of ``sum``, ``count`` (non-null values), ``min``, ``max``, ``mean``. After each batch it sends a
    batch with one row per key the batch held: the key column, then ``<column>_<aggregate>`` per aggregate, each the
    value over every row of the key so far. Each key's accumulators are its keyed state (they rescale with their key
    group)."""

    kind = "aggregate_batches"

    def __init__(self, id: str, column: str, aggs: dict[str, str | list[str]], **kw: Any) -> None:
        super().__init__(id, route_key, **kw)
        self.column = column
        self.aggs = {c: [f] if isinstance(f, str) else list(f) for c, f in aggs.items()}
        if not self.aggs:
            raise PipelineError(f"aggregate {id!r}: name at least one column and its aggregates")
        for c, fns in self.aggs.items():
            bad = [f for f in fns if f not in AGGREGATES]
            if bad or not fns:
                raise PipelineError(f"aggregate {id!r}: {bad or fns} for column {c!r}: choose from "
                                    f"{', '.join(AGGREGATES)}")

    def bind(self, out: Emit) -> Emit:
        import pyarrow as pa

        column, state = self.column, self.state
        assert state is not None
        partials = [(c, p) for c, fns in self.aggs.items() for p in partial_aggregates(fns)]
        outputs = [(c, f) for c, fns in self.aggs.items() for f in fns]

        def process(kb: SubtaskBatch | KeyedBatch) -> None:
            # one group_by over the sub-batch (its rows may be of several key groups); each key's state is in the
            # key group the current key hash gives it, also for a KeyedBatch of a checkpoint of an older hash
            if kb.batch.num_rows == 0:
                return
            table = pa.Table.from_batches([kb.batch])
            grouped = table.group_by(column, use_threads=False).aggregate(partials)
            keys = grouped.column(column).to_pylist()
            parts = [grouped.column(f"{c}_{p}").to_pylist() for c, p in partials]
            groups = key_groups_of(keys, state.max_parallelism, state.key_group_range, f"aggregate {self.id!r}")
            results: dict[str, list[Any]] = {f"{c}_{f}": [] for c, f in outputs}
            for i, k in enumerate(keys):
                accs = state.group(groups[i], k)
                acc = accs.get(k) or {}
                acc = {(c, p): merge_partial(p, acc.get((c, p)), parts[j][i]) for j, (c, p) in enumerate(partials)}
                accs[k] = acc
                for c, f in outputs:
                    if f == "mean":
                        s, n = acc[(c, "sum")], acc[(c, "count")]
                        results[f"{c}_{f}"].append(None if not n else s / n)
                    else:
                        results[f"{c}_{f}"].append(acc[(c, f)])
            out(pa.RecordBatch.from_pydict({column: keys, **results}))

        return process
