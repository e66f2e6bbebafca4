"""Event-time windows over a keyed batch stream: tumbling and sliding windows whose aggregates (``sum``, ``count``,
``min``, ``max``, ``mean``) are updated a batch at a time with Arrow compute, and fired by the watermark as the record
path's windows are (``spark_plugin.api.windows``: same assigners, same lateness rule).

Each sub-batch (:class:`~spark_plugin.api.batches.SubtaskBatch`, the rows of the key groups one subtask owns, or a
:class:`~spark_plugin.api.batches.KeyedBatch` of an older checkpoint) is assigned to windows vectorized (a row of a
sliding window is repeated once per window it belongs to), grouped by key and window start with ``pyarrow``'s
``group_by`` once, and merged into partial accumulators kept per key group (each distinct key's, which the subtask
must own) as ``{window start: {key: [partials]}}`` (the same dicts again by start, which is how a checkpoint holds
them: see :meth:`KeyedBatchWindowAggregate.snapshot`), and the timers' namespace is that start too: an int, not a
``TimeWindow`` (see :meth:`KeyedBatchWindowAggregate.restore` for checkpoints that hold those). Timers are per key group and
window (not per key): when the watermark reaches a window's last millisecond, each key group's timer adds one row
per key of it with rows in the window, and the round of timers sends one ``RecordBatch`` per window. Both are keyed
state by key group, so a checkpoint holds them by key group and a rescaled restore loads those of its range.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from contract.keygroups import KEY_HASH_VERSION
from spark_plugin.api.batches import (
    AGGREGATES,
    KeyedBatch,
    SubtaskBatch,
    key_groups_of,
    merge_partial,
    partial_aggregates,
    route_key,
)
from spark_plugin.api.errors import PipelineError
from spark_plugin.api.operators import Emit
from spark_plugin.api.timers import EVENT_TIME, TimedOperator
from spark_plugin.api.watermarks import epoch_ms
from spark_plugin.api.windows import SlidingEventTimeWindows, TimeWindow, TumblingEventTimeWindows, late_tag

PICKLED = "pickled"
"""The key of a whole snapshot pickled in one piece (the form checkpoints before ``CHUNKS`` hold)."""

CHUNKS = "chunks"
"""The key of a snapshot's windows: ``{window start: pickled ({key group: accumulators by key}, [key group])}``, the
list naming the key groups whose window of that start fired already (within its allowed lateness)."""

START, END = "window_start", "window_end"
"""The result columns of a window's bounds (epoch ms, ``[start, end)``)."""


def window_shape(assigner: Any) -> tuple[int, int, int]:
    """``(size, slide, offset)`` of a tumbling or sliding assigner; any other raises PipelineError."""
    if isinstance(assigner, TumblingEventTimeWindows):
        return assigner.size, assigner.size, assigner.offset
    if isinstance(assigner, SlidingEventTimeWindows):
        return assigner.size, assigner.slide, assigner.offset
    raise PipelineError(
        f"window {assigner!r} over a batch stream: batch windows are TumblingEventTimeWindows.of(size), "
        "SlidingEventTimeWindows.of(size, slide) or EventTimeSessionWindows.with_gap(gap)"
    )


def checked_aggregates(what: str, aggs: dict[str, str | list[str]]) -> dict[str, list[str]]:
    """``aggs`` with each column's aggregates as a list; PipelineError when there are none or one is unknown."""
    checked = {c: [f] if isinstance(f, str) else list(f) for c, f in aggs.items()}
    if not checked:
        raise PipelineError(f"{what}: name at least one column and its aggregates")
    for c, fns in checked.items():
        bad = [f for f in fns if f not in AGGREGATES]
        if bad or not fns:
            raise PipelineError(f"{what}: {bad or fns} for column {c!r}: choose from {', '.join(AGGREGATES)}")
    return checked


def event_times(batch: Any, column: str, what: str) -> Any:
    """The event times of ``batch``'s rows (its ``column``) as a NumPy int64 array of epoch ms; a row without one
    raises ValueError (a window cannot place it)."""
    values = epoch_ms(batch, column)
    if values.null_count:
        raise ValueError(
            f"{what}: {values.null_count} rows of a batch have no event time (null in {column!r}); filter them out "
            "before, or give them a time"
        )
    return values.to_numpy(zero_copy_only=False).astype("int64", copy=False)


def assign_windows(ts: Any, size: int, slide: int, offset: int) -> tuple[Any, Any]:
    """For event times ``ts`` (a NumPy int64 array), every (row, window) pair as two arrays: the row index and the
    window start, the windows of each row the record path's assigners give it (``start > ts - size``)."""
    import numpy as np

    last = ts - (ts - offset + slide) % slide  # the latest window of each row (the one that ends last)
    per_row = -(-size // slide)
    starts = last[None, :] - slide * np.arange(per_row, dtype=np.int64)[:, None]
    member = starts > (ts - size)[None, :]
    rows = np.broadcast_to(np.arange(len(ts), dtype=np.int64), starts.shape)
    return rows[member], starts[member]


class KeyedBatchWindowAggregate(TimedOperator):
    """Per key and event-time window of a keyed batch stream, ``aggs`` (a column to one or several of ``sum``,
    ``count`` of non-null values, ``min``, ``max``, ``mean``) over the rows whose ``time_column`` falls in the
    window. A fired window sends a batch of one row per key: the key column, ``window_start``, ``window_end``, then
    ``<column>_<aggregate>``.

    A row is late when every window it belongs to ended ``allowed_lateness`` ms or more before the watermark: it
    goes to the side output (``late_records()``, as a batch of the late rows), or is dropped when nothing reads it;
    either way :attr:`late_records` counts it. A row within the allowed lateness of a fired window joins it, and the
    window fires again at once for the keys it updated."""

    kind = "window_aggregate_batches"

    def __init__(self, id: str, key_column: str, assigner: Any, time_column: str,
                 aggs: dict[str, str | list[str]], allowed_lateness: int = 0, **kw: Any) -> None:
        super().__init__(id, route_key, **kw)
        self.key_column = key_column
        self.size, self.slide, self.offset = window_shape(assigner)
        self.assigner = assigner
        self.time_column = time_column
        if not isinstance(allowed_lateness, int) or allowed_lateness < 0:
            raise PipelineError(f"allowed_lateness must be a non-negative number of ms, got {allowed_lateness!r}")
        self.allowed_lateness = allowed_lateness
        self.aggs = checked_aggregates(f"window aggregate {id!r}", aggs)
        self.partials = [(c, p) for c, fns in self.aggs.items() for p in partial_aggregates(fns)]
        self.outputs = [(c, f) for c, fns in self.aggs.items() for f in fns]
        self.late_records = 0
        """Late rows this subtask sent to the side output (or dropped, when nothing reads it)."""
        self._fired: dict[int, dict[str, list[Any]]] = {}
        """Result columns of the windows fired in this round of timers, sent by ``timers_fired``."""
        self._chunks: dict[int, bytes] = {}
        """Per window start, its key groups' windows and timers as the last snapshot pickled them."""
        self._dirty: set[int] | None = None
        """The window starts whose windows or timers changed since the last snapshot (None: every start)."""
        self._by_start: dict[int, dict[int, dict[Any, list[Any]]]] = {}
        """The windows again by start: ``{window start: {key group: {key: [partials]}}}``, the same dicts as the
        keyed state's (``{key group: {window start: ...}}``), so a checkpoint pickles a start's windows as they
        are."""

    def bind_side_outputs(self, emits: dict[str, Emit]) -> None:
        self._late = emits.get(late_tag(self.id))

    def bind(self, out: Emit) -> Emit:
        import pyarrow as pa

        assert self.state is not None
        self._out = out
        self._late: Emit | None = getattr(self, "_late", None)
        groups, timers = self.state.groups, self.timers
        key_column = self.key_column
        size, slide, offset, lateness = self.size, self.slide, self.offset, self.allowed_lateness
        partials = self.partials
        max_parallelism, own = self.state.max_parallelism, self.state.key_group_range
        columns = list(dict.fromkeys(c for c, _ in partials))
        names = [f"{c}_{p}" for c, p in partials]

        def process(kb: SubtaskBatch | KeyedBatch) -> None:
            import numpy as np
            import pyarrow.compute as pc

            batch = kb.batch
            if batch.num_rows == 0:
                return
            ts = self._event_times(batch)
            # the key group of each row, from its distinct keys (each must be this subtask's)
            encoded = pc.dictionary_encode(batch.column(key_column), null_encoding="encode")
            distinct = encoded.dictionary.to_pylist()
            group_of = key_groups_of(distinct, max_parallelism, own, f"window aggregate {self.id!r}")
            kg_of_key = dict(zip(distinct, group_of, strict=True)) if len(distinct) > 1 else None
            wm_of_distinct = np.fromiter((timers.watermark_of(g) for g in group_of), dtype=np.int64,
                                         count=len(group_of))
            if len(set(wm_of_distinct.tolist())) == 1:
                wm_rows: Any = int(wm_of_distinct[0])
            else:
                wm_rows = wm_of_distinct[encoded.indices.to_numpy(zero_copy_only=False)]
            last = ts - (ts - offset + slide) % slide
            late = last + (size - 1 + lateness) <= wm_rows  # even the row's latest window is gone
            if late.any():
                self._on_late(batch.filter(pa.array(late)))
            rows, starts = assign_windows(ts, size, slide, offset)
            open_ = starts + (size - 1 + lateness) > (wm_rows if isinstance(wm_rows, int) else wm_rows[rows])
            rows, starts = rows[open_], starts[open_]
            if not len(rows):
                return
            take = pa.array(rows)
            table = pa.table({"__key": batch.column(key_column).take(take), "__start": starts,
                              **{c: batch.column(c).take(take) for c in columns}})
            grouped = table.group_by(["__key", "__start"], use_threads=False).aggregate(partials)
            keys = grouped.column("__key").to_pylist()
            window_starts = grouped.column("__start").to_pylist()
            parts = [grouped.column(n).to_pylist() for n in names]
            refired: dict[tuple[int, int], list[Any]] = {}
            only = group_of[0]
            dirty, by_start = self._dirty, self._by_start
            if dirty is not None:
                dirty.update(window_starts)
            for i, (k, s) in enumerate(zip(keys, window_starts, strict=True)):
                kg = only if kg_of_key is None else kg_of_key[k]
                group = groups.get(kg)
                if group is None:
                    group = groups[kg] = {}
                wm = timers.watermark_of(kg)
                wins = group.get(s)
                if wins is None:
                    wins = group[s] = {}
                    at = by_start.get(s)
                    if at is None:
                        at = by_start[s] = {}
                    at[kg] = wins
                    end = s + size - 1
                    if end > wm:
                        timers.register_event_time(kg, end, s, kg)
                    if lateness:
                        timers.register_event_time(kg, end + lateness, s, kg)
                acc = wins.get(k)
                if acc is None:
                    wins[k] = [p[i] for p in parts]
                else:
                    wins[k] = [merge_partial(p, acc[j], parts[j][i]) for j, (_, p) in enumerate(partials)]
                if s + size - 1 <= wm:  # a late firing: the window fired already, within its lateness
                    refired.setdefault((kg, s), []).append(k)
            for (kg, s), ks in refired.items():
                out(self._result(TimeWindow(s, s + size), ks, groups[kg][s]))

        return process

    def _event_times(self, batch: Any) -> Any:
        return event_times(batch, self.time_column, f"window aggregate {self.id!r}")

    def _result(self, window: TimeWindow, keys: list[Any], wins: dict[Any, list[Any]]) -> Any:
        """The result batch of ``window`` for ``keys``: key, bounds, then each aggregate."""
        import pyarrow as pa

        return pa.RecordBatch.from_pydict(self._columns(window, keys, wins))

    def _columns(self, window: TimeWindow, keys: list[Any], wins: dict[Any, list[Any]],
                 into: dict[str, list[Any]] | None = None) -> dict[str, list[Any]]:
        """The result columns of ``window`` for ``keys`` (appended to ``into``, when given)."""
        index = {cp: j for j, cp in enumerate(self.partials)}
        cols: dict[str, list[Any]] = into if into is not None else {}
        cols.setdefault(self.key_column, []).extend(keys)
        cols.setdefault(START, []).extend([window.start] * len(keys))
        cols.setdefault(END, []).extend([window.end] * len(keys))
        for c, f in self.outputs:
            if f == "mean":
                s, n = index[(c, "sum")], index[(c, "count")]
                values = [None if not wins[k][n] else wins[k][s] / wins[k][n] for k in keys]
            else:
                j = index[(c, f)]
                values = [wins[k][j] for k in keys]
            cols.setdefault(f"{c}_{f}", []).extend(values)
        return cols

    def timers_fired(self) -> None:
        """Send what the round's timers gathered: one batch per window, its key groups' rows together, windows in
        the order they fired (a window's timers are one per key group: one batch each was a batch of a few rows)."""
        import pyarrow as pa

        fired, self._fired = self._fired, {}
        for cols in fired.values():
            self._out(pa.RecordBatch.from_pydict(cols))

    # ------------------------------------------------------------------ checkpoints

    def snapshot(self, checkpoint_id: int) -> Any:
        """The windows and their timers by window start, each start's pickled on its own and kept until its
        windows or timers change (:data:`CHUNKS`), so a checkpoint pickles only the starts that changed since the
        last one; the rest of the state (watermarks, floors) whole.

        Most open windows do not change between two checkpoints: a window stops changing once event time has moved
        past it, and stays until the watermark fires it; where splits are far apart in event time, that is most of
        them. Pickling them all again was nearly all of a checkpoint's synchronous phase. A start's windows are
        pickled as the operator keeps them by start (no dict is built for the checkpoint) and without the pickler's
        memo (``Pickler.fast``: a tree of dicts, lists and ints with no object reached twice). 2,700 open starts of
        63 keys each: all of them 21 ms (the whole state pickled in one piece took 209 ms), the 780 that one
        checkpoint of ``bench batches`` changed 8 ms."""
        assert self.state is not None
        event, dirty, by_start = self.timers.event.groups, self._dirty, self._by_start
        fire = self.size - 1
        for s in (by_start if dirty is None else dirty):
            wins = by_start.get(s)
            if not wins:
                self._chunks.pop(s, None)
                continue
            # A window's last timer (the end of its lateness) is pending while it exists: that timer drops it. Its
            # firing is pending too without lateness (the same timer); with lateness, until the window fired.
            fired = [kg for kg in wins if (s + fire, kg, s) not in event.get(kg, ())] if self.allowed_lateness else []
            out = io.BytesIO()
            pickler = pickle.Pickler(out, protocol=5)
            pickler.fast = True
            pickler.dump((wins, fired))
            self._chunks[s] = out.getvalue()
        self._dirty = set()
        return {CHUNKS: dict(self._chunks), "timer_offsets": (fire, fire + self.allowed_lateness),
                "timers": self.timers.snapshot(event=False), "key_hash": KEY_HASH_VERSION}

    def restore(self, state: Any) -> None:
        """Load a snapshot of any form: by window start (:data:`CHUNKS`), pickled whole (:data:`PICKLED`), or one
        taken before windows were kept by their start (a ``TimeWindow`` in the state and in each timer), which is
        read into starts first. Every start's chunk is unpickled; the key groups outside this subtask's range are
        dropped."""
        assert self.state is not None
        self._chunks, self._dirty = {}, None  # the next snapshot pickles every start again
        if state and CHUNKS in state:
            lo, hi = self.state.key_group_range
            keyed: dict[int, dict[int, Any]] = {}
            event: dict[int, list[tuple[int, int, int]]] = {}
            fire, gone = state["timer_offsets"]  # as the snapshot's windows had them
            for s, pickled in state[CHUNKS].items():
                wins_of, fired = pickle.loads(pickled)
                for kg, wins in wins_of.items():
                    if lo <= kg <= hi:
                        keyed.setdefault(kg, {})[s] = wins
                        timers = event.setdefault(kg, [])
                        timers.append((s + gone, kg, s))
                        if gone != fire and kg not in fired:
                            timers.append((s + fire, kg, s))
            state = {"keyed": keyed, "key_hash": state["key_hash"],
                     "timers": {**state["timers"], "event": event}}
        elif state and PICKLED in state:
            state = pickle.loads(state[PICKLED])
        elif state:
            state = {**state, "keyed": {kg: {_start(w): wins for w, wins in group.items()}
                                        for kg, group in state["keyed"].items()}}
            if "timers" in state:
                timers = state["timers"]
                state["timers"] = {**timers, "event": {kg: [(ts, key, _start(w)) for ts, key, w in group]
                                                       for kg, group in timers["event"].items()}}
        super().restore(state)
        self._by_start = {}
        for kg, group in self.state.groups.items():
            for s, wins in group.items():
                self._by_start.setdefault(s, {})[kg] = wins

    def _on_late(self, rows: Any) -> None:
        self.late_records += rows.num_rows
        if self._late is not None:
            self._late(rows)

    def on_timer(self, domain: str, timestamp: int, key: Any, namespace: Any) -> None:
        """``key`` is the key group and ``namespace`` the window's start: a window's timers are one per key group."""
        if domain != EVENT_TIME:
            return
        assert self.state is not None
        start: int = namespace
        if self._dirty is not None:
            self._dirty.add(start)
        group = self.state.groups.get(key)
        wins = group.get(start) if group is not None else None
        if wins is None:
            return
        end = start + self.size
        if timestamp == end - 1 and wins:
            self._columns(TimeWindow(start, end), list(wins), wins, self._fired.setdefault(start, {}))
        if timestamp == end - 1 + self.allowed_lateness:
            del group[start]  # type: ignore[union-attr]
            at = self._by_start[start]
            del at[key]
            if not at:
                del self._by_start[start]
            if not group:
                del self.state.groups[key]



def _start(window: int | TimeWindow) -> int:
    """A window's start: the state's key and the timers' namespace (a ``TimeWindow`` in older checkpoints)."""
    return window.start if isinstance(window, TimeWindow) else window
