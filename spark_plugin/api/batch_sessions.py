"""Event-time session windows over a keyed batch stream: per key, rows less than ``gap`` ms apart (or exactly
``gap``) form one session ``[first, last + gap)``, whose aggregates (``sum``, ``count``, ``min``, ``max``, ``mean``)
are updated a batch at a time, and which the watermark fires and lateness treats as the record path's session
windows (``spark_plugin.api.windows.WindowOperator``: same merging, same lateness rule).

A sub-batch's rows are sorted by key and event time with NumPy and cut where two consecutive times of a key are more
than ``gap`` apart; ``pyarrow``'s ``group_by`` aggregates each cut into partial accumulators at once, and each cut,
a session of the batch, then merges into its key's sessions: every session it overlaps or touches is absorbed,
accumulators merged. Sessions are keyed state by key group (``{key group: {key: {(start, end): [partials]}}}``), and
their timers too: one per key group and session at ``end - 1`` (it fires) and, with lateness, at ``end - 1 +
allowed_lateness`` (it is dropped), with the session ``(key, start, end)`` as namespace; a merge deletes the timers
of the sessions it absorbed. A checkpoint holds both by key group, so a rescaled restore loads those of its range.

Whether a row is late can depend on the rows before it in the batch (an earlier row may make the session a later
one joins in time), so the keys of the rows whose own session ``[ts, ts + gap)`` is gone already go row by row, in
batch order, as records would; the rest of the batch is cut, vectorized, in any order (it cannot be late).
"""

from __future__ import annotations

from typing import Any

from spark_plugin.api.batch_windows import END, START, checked_aggregates, event_times
from spark_plugin.api.batches import (
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
from spark_plugin.api.windows import EventTimeSessionWindows, late_tag

Session = tuple[int, int]
"""A session's ``(start, end)``: the event time ``[start, end)`` in epoch ms."""

_SESSION, _ROW = "__session", "__row"
"""The columns that number a batch's sessions (and its rows, one by one) for ``group_by``."""


class KeyedBatchSessionAggregate(TimedOperator):
    """Per key and event-time session of a keyed batch stream, ``aggs`` (a column to one or several of ``sum``,
    ``count`` of non-null values, ``min``, ``max``, ``mean``) over the session's rows (``time_column`` their event
    time). A round of timers sends the sessions it fired as one batch of a row per (key, session): the key column,
    ``window_start``, ``window_end``, then ``<column>_<aggregate>``.

    A row is late when the session it would make, with every session of its key it overlaps or touches then, ended
    ``allowed_lateness`` ms or more before the watermark: it goes to the side output (``late_records()``, as a batch
    of the late rows), or is dropped when nothing reads it; either way :attr:`late_records` counts it. A row within
    the allowed lateness of a fired session joins it, and the session fires again at once, updated."""

    kind = "session_aggregate_batches"

    def __init__(self, id: str, key_column: str, assigner: Any, time_column: str,
                 aggs: dict[str, str | list[str]], allowed_lateness: int = 0, **kw: Any) -> None:
        super().__init__(id, route_key, **kw)
        if not isinstance(assigner, EventTimeSessionWindows):
            raise PipelineError(f"session aggregate {id!r}: {assigner!r} is not EventTimeSessionWindows.with_gap(gap)")
        if not isinstance(allowed_lateness, int) or allowed_lateness < 0:
            raise PipelineError(f"allowed_lateness must be a non-negative number of ms, got {allowed_lateness!r}")
        self.key_column = key_column
        self.assigner = assigner
        self.gap = assigner.gap
        self.time_column = time_column
        self.allowed_lateness = allowed_lateness
        self.aggs = checked_aggregates(f"session aggregate {id!r}", aggs)
        self.partials = [(c, p) for c, fns in self.aggs.items() for p in partial_aggregates(fns)]
        index = {cp: j for j, cp in enumerate(self.partials)}
        self.outputs = [(f"{c}_{f}", index[(c, "sum")], index[(c, "count")]) if f == "mean"
                        else (f"{c}_{f}", index[(c, f)], None) for c, fns in self.aggs.items() for f in fns]
        """Each result column: its name and the partial it is (a mean: the sum's, then the count's)."""
        self.late_records = 0
        """Late rows this subtask sent to the side output (or dropped, when nothing reads it)."""
        self._fired: dict[str, list[Any]] = {}
        """Result columns of the sessions fired in this round of timers, sent by ``timers_fired``."""

    def bind_side_outputs(self, emits: dict[str, Emit]) -> None:
        self._late = emits.get(late_tag(self.id))

    def bind(self, out: Emit) -> Emit:
        import numpy as np
        import pyarrow.compute as pc

        assert self.state is not None
        self._out = out
        self._late: Emit | None = getattr(self, "_late", None)
        timers, key_column = self.timers, self.key_column
        max_parallelism, own = self.state.max_parallelism, self.state.key_group_range
        gone = self.gap - 1 + self.allowed_lateness  # a row's own session ends at ts + gap - 1

        def process(kb: SubtaskBatch | KeyedBatch) -> None:
            batch = kb.batch
            if batch.num_rows == 0:
                return
            ts = event_times(batch, self.time_column, f"session aggregate {self.id!r}")
            # the key group of each row, from its distinct keys (each must be this subtask's)
            encoded = pc.dictionary_encode(batch.column(key_column), null_encoding="encode")
            distinct = encoded.dictionary.to_pylist()
            group_of = key_groups_of(distinct, max_parallelism, own, f"session aggregate {self.id!r}")
            wm_of = [timers.watermark_of(g) for g in group_of]
            indices = encoded.indices.to_numpy(zero_copy_only=False).astype("int64", copy=False)
            wm_rows = np.array(wm_of, dtype=np.int64)[indices]
            touched: dict[tuple[int, Any, Session], None] = {}
            old = ts + gone <= wm_rows  # the row's own session is gone: is it late? That depends on the rows before
            if old.any():
                by_row = np.zeros(len(distinct), dtype=bool)
                by_row[indices[old]] = True
                one_by_one = by_row[indices]
                late = self._row_by_row(batch, np.flatnonzero(one_by_one), ts, indices, distinct, group_of,
                                        wm_of, touched)
                if late:
                    self._on_late(batch.take(late))
                rest = np.flatnonzero(~one_by_one)
                if len(rest):
                    self._cut(batch, rest, ts, indices, distinct, group_of, touched)
            else:
                self._cut(batch, None, ts, indices, distinct, group_of, touched)
            self._settle(touched)

        return process

    # ------------------------------------------------------------------ a batch's sessions

    def _cut(self, batch: Any, rows: Any, ts: Any, indices: Any, distinct: list[Any], group_of: list[int],
             touched: dict[tuple[int, Any, Session], None]) -> None:
        """Cut ``rows`` of ``batch`` (None: all of them) into the sessions they make per key, aggregate each with one
        ``group_by``, and merge each into its key's sessions. None of these rows can be late: the order they merge
        in does not matter."""
        import numpy as np
        import pyarrow as pa

        if rows is not None:
            ts, indices = ts[rows], indices[rows]
        order = np.lexsort((ts, indices))  # by key, then by event time
        times, keys = ts[order], indices[order]
        cut = np.empty(len(order), dtype=bool)
        cut[0] = True
        cut[1:] = (keys[1:] != keys[:-1]) | (times[1:] - times[:-1] > self.gap)
        first = np.flatnonzero(cut)
        last = np.append(first[1:] - 1, len(order) - 1)
        take = pa.array(order if rows is None else rows[order])
        columns = dict.fromkeys(c for c, _ in self.partials)
        table = pa.table({_SESSION: np.cumsum(cut) - 1, **{c: batch.column(c).take(take) for c in columns}})
        grouped = table.group_by(_SESSION, use_threads=False).aggregate(self.partials)
        sessions = grouped.column(_SESSION).to_numpy()
        parts = [grouped.column(f"{c}_{p}").to_pylist() for c, p in self.partials]
        starts = times[first][sessions].tolist()
        ends = (times[last][sessions] + self.gap).tolist()
        key_of = keys[first][sessions].tolist()
        for i, d in enumerate(key_of):
            self._merge(group_of[d], distinct[d], starts[i], ends[i], [p[i] for p in parts], touched)

    def _row_by_row(self, batch: Any, rows: Any, ts: Any, indices: Any, distinct: list[Any], group_of: list[int],
                    wm_of: list[int], touched: dict[tuple[int, Any, Session], None]) -> list[int]:
        """Merge ``rows`` of ``batch`` one at a time, in batch order, as the record path does with records; returns
        the late ones (their row numbers)."""
        import numpy as np
        import pyarrow as pa

        assert self.state is not None
        columns = dict.fromkeys(c for c, _ in self.partials)
        table = pa.table({_ROW: np.arange(len(rows)), **{c: batch.column(c).take(pa.array(rows)) for c in columns}})
        grouped = table.group_by(_ROW, use_threads=False).aggregate(self.partials)
        parts = [grouped.column(f"{c}_{p}").to_pylist() for c, p in self.partials]
        acc_of: list[Any] = [None] * len(rows)
        for i, j in enumerate(grouped.column(_ROW).to_pylist()):
            acc_of[j] = [p[i] for p in parts]
        groups, gap, lateness = self.state.groups, self.gap, self.allowed_lateness
        late = []
        for j, (r, t, d) in enumerate(zip(rows.tolist(), ts[rows].tolist(), indices[rows].tolist(), strict=True)):
            kg, key = group_of[d], distinct[d]
            sessions = groups.get(kg, {}).get(key, {})
            end = max([t + gap, *(e for s, e in sessions if s <= t + gap and t <= e)])
            if end - 1 + lateness <= wm_of[d]:
                late.append(r)
            else:
                self._merge(kg, key, t, t + gap, acc_of[j], touched)
        return late

    def _merge(self, kg: int, key: Any, start: int, end: int, acc: list[Any],
               touched: dict[tuple[int, Any, Session], None]) -> None:
        """Merge the session ``[start, end)`` of ``key`` (its partials ``acc``) into the key's sessions: it absorbs
        every one it overlaps or touches (a key's sessions never touch one another, so one pass finds them all);
        the timers of those it absorbed go with them."""
        assert self.state is not None
        groups, timers, lateness = self.state.groups, self.timers, self.allowed_lateness
        group = groups.get(kg)
        if group is None:
            group = groups[kg] = {}
        sessions = group.get(key)
        if sessions is None:
            sessions = group[key] = {}
        absorbed = [w for w in sessions if w[0] <= end and start <= w[1]]
        for s, e in absorbed:
            start, end = min(start, s), max(end, e)
        for w in absorbed:
            part = sessions.pop(w)
            acc = [merge_partial(p, old, new) for (_, p), old, new in zip(self.partials, part, acc, strict=True)]
            if w != (start, end):  # the session it was is gone (when it only grew inside, its timers still hold)
                touched.pop((kg, key, w), None)
                timers.delete_event_time(kg, w[1] - 1, (key, *w), kg)
                if lateness:
                    timers.delete_event_time(kg, w[1] - 1 + lateness, (key, *w), kg)
        sessions[(start, end)] = acc
        touched[(kg, key, (start, end))] = None

    def _settle(self, touched: dict[tuple[int, Any, Session], None]) -> None:
        """The sessions a batch made or changed: their timers, or (a session that fired already, within its
        lateness) one result batch of all of them at once."""
        import pyarrow as pa

        assert self.state is not None
        groups, timers, lateness = self.state.groups, self.timers, self.allowed_lateness
        refired: dict[str, list[Any]] = {}
        for kg, key, (start, end) in touched:
            if end - 1 <= timers.watermark_of(kg):  # a late firing: the session fired already, within its lateness
                self._row(refired, key, start, end, groups[kg][key][(start, end)])
            else:
                timers.register_event_time(kg, end - 1, (key, start, end), kg)
            if lateness:
                timers.register_event_time(kg, end - 1 + lateness, (key, start, end), kg)
        if refired:
            self._out(pa.RecordBatch.from_pydict(refired))

    def _row(self, cols: dict[str, list[Any]], key: Any, start: int, end: int, acc: list[Any]) -> None:
        """Append the result row of ``key``'s session ``[start, end)`` to ``cols``."""
        cols.setdefault(self.key_column, []).append(key)
        cols.setdefault(START, []).append(start)
        cols.setdefault(END, []).append(end)
        for name, j, n in self.outputs:
            cols.setdefault(name, []).append(acc[j] if n is None else None if not acc[n] else acc[j] / acc[n])

    def _on_late(self, rows: Any) -> None:
        self.late_records += rows.num_rows
        if self._late is not None:
            self._late(rows)

    # ------------------------------------------------------------------ timers

    def on_timer(self, domain: str, timestamp: int, key: Any, namespace: Any) -> None:
        """``key`` is the key group and ``namespace`` the session ``(key, start, end)``; a session merged into a
        bigger one has no timers left, and one that is gone is skipped."""
        if domain != EVENT_TIME:
            return
        assert self.state is not None
        k, start, end = namespace
        group = self.state.groups.get(key)
        sessions = group.get(k) if group is not None else None
        if sessions is None or (start, end) not in sessions:
            return
        if timestamp == end - 1:
            self._row(self._fired, k, start, end, sessions[(start, end)])
        if timestamp == end - 1 + self.allowed_lateness:
            del sessions[(start, end)]
            if not sessions:
                del group[k]  # type: ignore[union-attr]
                if not group:
                    del self.state.groups[key]

    def timers_fired(self) -> None:
        """Send what the round's timers gathered: one batch of every session they fired."""
        import pyarrow as pa

        fired, self._fired = self._fired, {}
        if fired:
            self._out(pa.RecordBatch.from_pydict(fired))
