"""PostgreSQL sink with exactly-once output: rows of checkpoint n are inserted when n completes.

Rows written between two checkpoints are kept with the snapshot (they are part of operator state), and
``checkpoint.completed`` inserts them in one transaction together with a commit marker
``(sink, job, subtask, checkpoint)`` in ``overtake_sink_commits``. A commit repeated after a restore finds its
marker and changes nothing, so every row lands exactly once.

A restore that goes back past a committed checkpoint (a fallback past a corrupt checkpoint, or a start from an
older checkpoint or savepoint by name) produces that checkpoint's output again. The sink withdraws the old copy
first, in one transaction: the marker keeps the id of the transaction that inserted the rows (PostgreSQL's
``xmin`` of each row it inserted) and how many it inserted, so the rows are found without a column of the
sink's own in the table, and the delete is checked against the count before it commits.

**Batches.** A ``pyarrow.RecordBatch`` (a batch stream's record) or a pandas ``DataFrame`` is kept whole and
written with ``COPY ... FROM STDIN`` in the same commit transaction, under the same marker, its columns taken by
name: the sink's ``columns``, or without them every column of the batch.

**Upserts.** With a ``key`` (the columns of the table's primary key or of a unique index) a commit writes its rows
with ``INSERT ... ON CONFLICT (key) DO UPDATE``, so the table holds one row per key, the latest value: a running
count per customer, the last reading per sensor. Exactly once is the same marker's; a rewind cannot withdraw rows
that an upsert changed, so it takes back the later commits' markers only (see :class:`PostgresSink`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from itertools import groupby
from typing import Any

from spark_plugin.connectors.base import Sink

MARKERS = "overtake_sink_commits"
STAGE = "pg_temp.overtake_upsert_stage"  # a commit's batches (and rows) before their upsert, in its transaction
ORDINAL = "overtake_write_order"  # the stage's column of each row's place in the commit's write order
log = logging.getLogger(__name__)


def _ident(name: str) -> str:
    from psycopg import sql

    return sql.Identifier(*name.split(".")).as_string(None)


class RewindRefused(RuntimeError):
    """Withdrawing committed output would delete rows the sink did not write; nothing was deleted."""


def _is_batch(record: Any) -> bool:
    return type(record).__name__ in ("RecordBatch", "DataFrame")


class PostgresSink(Sink):
    """Inserts ``to_row(record)`` into ``table (columns...)``, committed on checkpoint completion.

    A record that is a ``pyarrow.RecordBatch`` or a pandas ``DataFrame`` goes in with ``COPY``: its columns named
    by ``columns`` (by name, in any order; a batch without one of them fails the sink), or all of its columns when
    the sink names none (then it takes batches only). ``dsn`` is a libpq connection string or ``postgresql://``
    URL; ``name`` identifies this sink's commit markers within a job (default: the table name).

    **Upsert mode** (``key`` given: the columns, all of them and no other, of the table's primary key or of a unique
    index; a subset of ``columns``, and in every batch). A checkpoint's commit writes its rows with ``INSERT ...
    ON CONFLICT (key) DO UPDATE SET`` every other column it writes (``DO NOTHING`` when it writes key columns only).
    Rows of one commit with the same key are reduced to the last one written first, since one statement may not
    change a row twice: records alone in Python, and when the commit holds batches, its rows and batches together in
    a temporary table with their place in the write order, then one ``INSERT ... SELECT DISTINCT ON (key) ... ORDER BY
    key, <place> DESC``. So within a checkpoint a row written after a batch wins over it for a key, and vice versa;
    across checkpoints the later commit wins. The order is one subtask's: give a key to one sink subtask (the sink
    right after a keyed operator is). ``open`` checks the unique index and fails, writing nothing, without one.

    A commit repeated after a restore finds its marker and changes nothing, as in insert mode. A rewind cannot
    withdraw upserted rows (their transaction id is that of the last commit that changed them, and the values they
    had before are gone): it deletes the markers of the job's checkpoints after the restored one and no row of the
    table, and logs a warning naming those checkpoints. Until the new attempt writes those keys again, the table
    holds the values the later checkpoints gave them (ahead of the restored state; a key the replay does not write
    again keeps its value). ``close()`` reports ``upserted_rows``: rows the upserts inserted or updated after the
    per-key reduction (with only key columns, the new ones); ``withdrawn_checkpoints`` lists the checkpoints whose
    markers a rewind deleted, and ``withdrawn_rows`` stays 0.
    """

    commits_on_checkpoints = True

    def __init__(
        self,
        dsn: str,
        table: str,
        columns: Sequence[str] | None = None,
        to_row: Callable[[Any], Sequence[Any]] | None = None,
        name: str | None = None,
        key: Sequence[str] | None = None,
    ) -> None:
        self.dsn = dsn
        self.table = table
        self.columns = None if columns is None else list(columns)
        self.to_row = to_row or (lambda r: r)
        self.name = name or table
        self.key = None if key is None else self._checked_key(key)
        self.buffer: list[Any] = []  # rows (tuples) and batches, in the order written
        self.pending: list[tuple[int, list[Any]]] = []
        self.committed_rows = 0
        self.copied_rows = 0
        self.withdrawn_rows = 0
        self.withdrawn_checkpoints: list[int] = []
        self.upserted_rows = 0
        self._conn = None

    def _checked_key(self, key: Sequence[str]) -> list[str]:
        """``key`` as a list, refused with what to give instead when it cannot name a unique index of the sink's."""
        if isinstance(key, str):
            raise TypeError(f"PostgresSink {self.name!r}: key takes a sequence of column names, not a string: "
                            f"key=[{key!r}]")
        names = list(key)
        if not names:
            raise ValueError(f"PostgresSink {self.name!r}: key=[] names no column; give the columns of the primary key "
                             f"or of a unique index of {self.table}, or no key to insert every row")
        if len(set(names)) != len(names):
            raise ValueError(f"PostgresSink {self.name!r}: key {names} names a column twice")
        if self.columns is not None:
            missing = [c for c in names if c not in self.columns]
            if missing:
                raise ValueError(
                    f"PostgresSink {self.name!r}: key {names} is not among the columns it writes to {self.table}, "
                    f"{self.columns} (no {', '.join(map(repr, missing))}): add them to columns (and to_row's values)"
                )
        return names

    def open(self, subtask_index: int, parallelism: int) -> None:
        import psycopg

        super().open(subtask_index, parallelism)
        # autocommit: every transaction is an explicit BEGIN..COMMIT with no savepoints, so the rows a commit
        # inserts carry that transaction's id as their xmin
        self._conn = psycopg.connect(self.dsn, autocommit=True)
        try:
            if self.key is not None:
                self._check_unique_index()
            self._create_markers()
        except BaseException:
            self._conn.close()
            self._conn = None
            raise

    def _check_unique_index(self) -> None:
        """Fail unless the table has a primary key or a unique index over exactly ``key``, one that ``ON CONFLICT
        (key)`` takes as its arbiter (no expression, no predicate, not deferrable), before anything is written."""
        assert self._conn is not None and self.key is not None
        table = self._conn.execute("SELECT to_regclass(%s)::oid", (_ident(self.table),)).fetchone()
        if table is None or table[0] is None:
            raise ValueError(f"PostgresSink {self.name!r}: table {self.table} does not exist; create it with a primary "
                             f"key or unique index over the key {self.key}")
        indexes = self._conn.execute(
            "SELECT ARRAY(SELECT a.attname::text FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
            "WHERE k.n <= i.indnkeyatts ORDER BY k.n) "
            "FROM pg_index i WHERE i.indrelid = %s AND i.indisunique AND i.indisvalid AND i.indimmediate "
            "AND i.indexprs IS NULL AND i.indpred IS NULL ORDER BY NOT i.indisprimary, i.indexrelid",
            (table[0],),
        ).fetchall()
        keys = [cols for (cols,) in indexes]
        if not any(set(cols) == set(self.key) for cols in keys):
            found = "; ".join(f"({', '.join(cols)})" for cols in keys) or "none"
            cols = ", ".join(self.key)
            raise ValueError(
                f"PostgresSink {self.name!r}: key {self.key} is not the primary key or a unique index of table "
                f"{self.table} (its unique keys: {found}); an upsert needs one over exactly these columns: "
                f"ALTER TABLE {self.table} ADD PRIMARY KEY ({cols}), or CREATE UNIQUE INDEX ON {self.table} ({cols})"
            )

    def _create_markers(self) -> None:
        assert self._conn is not None
        with self._conn.transaction():
            # Subtasks open at the same time: CREATE TABLE IF NOT EXISTS alone races on PostgreSQL's catalog.
            self._conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (MARKERS,))
            self._conn.execute(
                f"CREATE TABLE IF NOT EXISTS {MARKERS} (sink text NOT NULL, job_id bigint NOT NULL, "
                "subtask int NOT NULL, checkpoint_id bigint NOT NULL, xact xid8 NOT NULL, row_count int NOT NULL, "
                "committed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (sink, job_id, subtask, checkpoint_id))"
            )
            has = self._conn.execute(
                "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname IN ('job_id', 'xact')",
                (MARKERS,),
            ).fetchone()
            if has is None or has[0] != 2:
                raise RuntimeError(
                    f"table {MARKERS} has the layout of an earlier Overtake version (no job_id/xact columns); "
                    "drop it (it only holds commit markers) and run again"
                )

    def write(self, record: Any) -> None:
        if _is_batch(record):
            self.buffer.append(self._batch(record))
        elif self.columns is None:
            raise TypeError(
                f"PostgresSink {self.name!r} names no columns, so it takes batches (a pyarrow.RecordBatch or a pandas "
                f"DataFrame) only, not {type(record).__name__}: give it columns=[...] for records"
            )
        else:
            self.buffer.append(tuple(self.to_row(record)))

    def _batch(self, record: Any) -> Any:
        """``record`` as a ``RecordBatch`` of the columns the sink writes, by name."""
        import pyarrow as pa

        if not isinstance(record, pa.RecordBatch):
            record = pa.RecordBatch.from_pandas(record, preserve_index=False)
        batch = record
        if self.columns is None:
            missing = [c for c in self.key or () if c not in batch.schema.names]
            if missing:
                raise KeyError(
                    f"PostgresSink {self.name!r} upserts into {self.table} on key {self.key}; the batch has no "
                    f"{', '.join(map(repr, missing))} (it has {batch.schema.names}): add it with map_batches"
                )
            return batch
        missing = [c for c in self.columns if c not in batch.schema.names]
        if missing:
            raise KeyError(
                f"PostgresSink {self.name!r} writes columns {self.columns} of {self.table}; the batch has no "
                f"{', '.join(map(repr, missing))} (it has {batch.schema.names}): rename or add them with map_batches"
            )
        return batch.select(self.columns)

    def snapshot(self, checkpoint_id: int) -> Any:
        if self.buffer:
            self.pending.append((checkpoint_id, self.buffer))
            self.buffer = []
        return {"subtask": self.subtask_index, "pending": list(self.pending)}

    def _commit(self, checkpoint_id: int, items: list[Any], subtask: int | None = None) -> None:
        assert self._conn is not None
        rows = [r for r in items if not _is_batch(r)]
        batches = [b for b in items if _is_batch(b)]
        count = len(rows) + sum(b.num_rows for b in batches)
        upserted = 0
        with self._conn.transaction():
            cur = self._conn.execute(
                f"INSERT INTO {MARKERS} (sink, job_id, subtask, checkpoint_id, xact, row_count) "
                "VALUES (%s, %s, %s, %s, pg_current_xact_id(), %s) ON CONFLICT DO NOTHING RETURNING checkpoint_id",
                (self.name, self.job_id, self.subtask_index if subtask is None else subtask, checkpoint_id, count),
            )
            if cur.fetchone() is None:
                return  # committed before (by the attempt that failed after committing)
            with self._conn.cursor() as c:
                if self.key is not None:
                    upserted = sum(self._upsert(c, columns, list(run)) for columns, run in self._runs(items))
                else:
                    if rows:
                        assert self.columns is not None
                        cols = ", ".join(_ident(col) for col in self.columns)
                        marks = ", ".join(["%s"] * len(self.columns))
                        c.executemany(f"INSERT INTO {_ident(self.table)} ({cols}) VALUES ({marks})", rows)
                    for batch in batches:
                        self._copy(c, batch)
        self.committed_rows += count
        self.copied_rows += count - len(rows)
        if self.key is not None:
            self.upserted_rows += upserted

    def _runs(self, items: list[Any]) -> Iterator[tuple[list[str], Iterator[Any]]]:
        """The commit's items in write order, in runs that write the same columns (rows: ``columns``; a batch: its
        own), each run one upsert: one after the other in the transaction, so the later run wins for a key."""
        for names, run in groupby(items, lambda i: tuple(i.schema.names) if _is_batch(i) else tuple(self.columns or ())):
            yield list(names), run

    def _upsert(self, cursor: Any, columns: list[str], run: list[Any]) -> int:
        """Upsert ``run`` (rows and batches writing ``columns``), the last one written winning for a key; returns
        the rows PostgreSQL inserted or updated."""
        assert self.key is not None
        cols = ", ".join(_ident(c) for c in columns)
        keys = ", ".join(_ident(k) for k in self.key)
        if not any(_is_batch(i) for i in run):  # records only: reduced here, no temporary table
            at = [columns.index(k) for k in self.key]
            last = {tuple(row[i] for i in at): row for row in run}
            marks = ", ".join(["%s"] * len(columns))
            cursor.executemany(self._upsert_sql(columns, f"VALUES ({marks})"), list(last.values()))
            return cursor.rowcount
        if not any(i.num_rows if _is_batch(i) else 1 for i in run):
            return 0
        cursor.execute(f"CREATE TEMP TABLE {STAGE} ON COMMIT DROP AS SELECT {cols}, 0::bigint AS {ORDINAL} "
                       f"FROM {_ident(self.table)} WITH NO DATA")
        with cursor.copy(f"COPY {STAGE} ({cols}, {ORDINAL}) FROM STDIN") as copy:
            n = 0
            for item in run:
                for row in zip(*(c.to_pylist() for c in item.columns), strict=True) if _is_batch(item) else [item]:
                    copy.write_row((*row, n))
                    n += 1
        cursor.execute(self._upsert_sql(
            columns, f"SELECT DISTINCT ON ({keys}) {cols} FROM {STAGE} ORDER BY {keys}, {ORDINAL} DESC"
        ))
        upserted = cursor.rowcount
        cursor.execute(f"DROP TABLE {STAGE}")  # the next run of the commit stages its own columns
        return upserted

    def _upsert_sql(self, columns: list[str], rows: str) -> str:
        """``INSERT`` of ``rows`` (a VALUES or SELECT clause) that updates every non-key column on a key's conflict."""
        assert self.key is not None
        others = [c for c in columns if c not in self.key]
        action = ("DO UPDATE SET " + ", ".join(f"{_ident(c)} = EXCLUDED.{_ident(c)}" for c in others)
                  if others else "DO NOTHING")
        cols = ", ".join(_ident(c) for c in columns)
        keys = ", ".join(_ident(k) for k in self.key)
        return f"INSERT INTO {_ident(self.table)} ({cols}) {rows} ON CONFLICT ({keys}) {action}"

    def _copy(self, cursor: Any, batch: Any) -> None:
        """The rows of ``batch`` into the table with ``COPY ... FROM STDIN``, its columns by name."""
        if not batch.num_rows:
            return
        cols = ", ".join(_ident(name) for name in batch.schema.names)
        values = [column.to_pylist() for column in batch.columns]
        with cursor.copy(f"COPY {_ident(self.table)} ({cols}) FROM STDIN") as copy:
            for row in zip(*values, strict=True):
                copy.write_row(row)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        keep = []
        for cid, rows in self.pending:
            if cid <= checkpoint_id:
                self._commit(cid, rows)
            else:
                keep.append((cid, rows))
        self.pending = keep

    def uncommitted(self) -> bool:
        return bool(self.buffer or self.pending)

    def rewind(self, job_id: int, checkpoint_id: int | None) -> None:
        """Delete the rows this sink committed for the job's checkpoints after ``checkpoint_id``, in one
        transaction, checked against the markers' row counts; idempotent (every subtask of the sink calls it). In
        upsert mode, only those checkpoints' markers (:meth:`_rewind_markers`)."""
        super().rewind(job_id, checkpoint_id)
        assert self._conn is not None
        if self.key is not None:
            self._rewind_markers(job_id, checkpoint_id)
            return
        after = -1 if checkpoint_id is None else checkpoint_id
        with self._conn.transaction():
            self._conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s), %s)", (f"{MARKERS}:{self.name}", job_id % 2**31))
            commits = self._conn.execute(
                f"SELECT checkpoint_id, xact::text, row_count FROM {MARKERS} "
                "WHERE sink = %s AND job_id = %s AND checkpoint_id > %s FOR UPDATE",
                (self.name, job_id, after),
            ).fetchall()
            if not commits:
                return
            expected: Counter[str] = Counter()
            for _, xact, rows in commits:
                expected[str(int(xact) % 2**32)] += rows  # xmin is the low 32 bits of the 64-bit transaction id
            deleted = Counter(
                r[0]
                for r in self._conn.execute(
                    f"DELETE FROM {_ident(self.table)} WHERE xmin = ANY(%s::text[]::xid[]) RETURNING xmin::text",
                    (sorted(expected),),
                ).fetchall()
            )
            checkpoints = sorted({c for c, _, _ in commits})
            extra = {x: n - expected[x] for x, n in deleted.items() if n > expected[x]}
            if extra:
                raise RewindRefused(
                    f"{type(self).__name__} {self.name!r} (job {job_id}): withdrawing the output of checkpoints "
                    f"{checkpoints} would delete {sum(extra.values())} more rows of {self.table} than their commits "
                    "inserted; nothing was deleted"
                )
            missing = sum(expected.values()) - sum(deleted.values())
            if missing:
                log.warning(
                    "%s %r (job %s): %d rows committed for checkpoints %s were changed or deleted since; "
                    "withdrew the %d still there", type(self).__name__, self.name, job_id, missing, checkpoints,
                    sum(deleted.values()),
                )
            self._conn.execute(
                f"DELETE FROM {MARKERS} WHERE sink = %s AND job_id = %s AND checkpoint_id > %s",
                (self.name, job_id, after),
            )
        self.withdrawn_rows += sum(deleted.values())
        self.withdrawn_checkpoints = sorted(set(self.withdrawn_checkpoints) | set(checkpoints))
        log.warning(
            "%s %r (job %s) restarts from %s: withdrew %d committed rows of checkpoints %s, which this attempt "
            "writes again", type(self).__name__, self.name, job_id,
            "the start" if checkpoint_id is None else f"checkpoint {checkpoint_id}", sum(deleted.values()), checkpoints,
        )

    def _rewind_markers(self, job_id: int, checkpoint_id: int | None) -> None:
        """Upsert mode's rewind: delete the markers of the job's checkpoints after ``checkpoint_id`` and no row (an
        upserted row's old value is gone), so this attempt commits that output again over the same keys."""
        assert self._conn is not None
        with self._conn.transaction():
            self._conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s), %s)", (f"{MARKERS}:{self.name}", job_id % 2**31))
            checkpoints = sorted({r[0] for r in self._conn.execute(
                f"DELETE FROM {MARKERS} WHERE sink = %s AND job_id = %s AND checkpoint_id > %s RETURNING checkpoint_id",
                (self.name, job_id, -1 if checkpoint_id is None else checkpoint_id),
            ).fetchall()})
        if not checkpoints:
            return
        self.withdrawn_checkpoints = sorted(set(self.withdrawn_checkpoints) | set(checkpoints))
        log.warning(
            "%s %r (job %s) restarts from %s: checkpoints %s were committed as upserts into %s, which cannot be "
            "withdrawn; deleted their commit markers and no row, so %s holds those checkpoints' values for their "
            "keys until this attempt writes the keys again", type(self).__name__, self.name, job_id,
            "the start" if checkpoint_id is None else f"checkpoint {checkpoint_id}", checkpoints, self.table, self.table,
        )

    def restore(self, state: Any) -> None:
        for cid, rows in state["pending"]:  # part of a completed checkpoint, written by subtask state["subtask"]
            self._commit(cid, [r if _is_batch(r) else tuple(r) for r in rows], state.get("subtask"))
        self.pending = []

    def close(self) -> Any:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        out = {
            "committed_rows": self.committed_rows,
            "uncommitted_rows": sum(r.num_rows if _is_batch(r) else 1 for r in self.buffer),
            "copied_rows": self.copied_rows,
            "withdrawn_rows": self.withdrawn_rows,
            "withdrawn_checkpoints": self.withdrawn_checkpoints,
        }
        if self.key is not None:
            out["upserted_rows"] = self.upserted_rows
        return out
