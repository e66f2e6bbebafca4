"""PostgreSQL sink with exactly-once output: rows of checkpoint n are inserted when n completes.

Rows written between two checkpoints are kept with the snapshot (they are part of operator state), and
``checkpoint.completed`` inserts them in one transaction together with a commit marker
``(sink, subtask, checkpoint_id)`` in ``overtake_sink_commits``. A commit repeated after a restore finds its
marker and changes nothing, so every row lands exactly once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from spark_plugin.sinks import Sink

MARKERS = "overtake_sink_commits"


def _ident(name: str) -> str:
    from psycopg import sql

    return sql.Identifier(*name.split(".")).as_string(None)


class PostgresSink(Sink):
    """Inserts ``to_row(record)`` into ``table (columns...)``, committed on checkpoint completion.

    ``dsn`` is a libpq connection string or ``postgresql://`` URL; ``name`` identifies this sink's commit
    markers (default: the table name) and must be unique among the jobs writing to the database.
    """

    commits_on_checkpoints = True

    def __init__(
        self,
        dsn: str,
        table: str,
        columns: Sequence[str],
        to_row: Callable[[Any], Sequence[Any]] | None = None,
        name: str | None = None,
    ) -> None:
        self.dsn = dsn
        self.table = table
        self.columns = list(columns)
        self.to_row = to_row or (lambda r: r)
        self.name = name or table
        self.buffer: list[tuple] = []
        self.pending: list[tuple[int, list[tuple]]] = []
        self.committed_rows = 0
        self._conn = None

    def open(self, subtask_index: int, parallelism: int) -> None:
        import psycopg

        super().open(subtask_index, parallelism)
        self._conn = psycopg.connect(self.dsn)
        with self._conn.transaction():
            # Subtasks open at the same time: CREATE TABLE IF NOT EXISTS alone races on PostgreSQL's catalog.
            self._conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (MARKERS,))
            self._conn.execute(
                f"CREATE TABLE IF NOT EXISTS {MARKERS} (sink text NOT NULL, subtask int NOT NULL, "
                "checkpoint_id bigint NOT NULL, committed_at timestamptz NOT NULL DEFAULT now(), "
                "PRIMARY KEY (sink, subtask, checkpoint_id))"
            )

    def write(self, record: Any) -> None:
        self.buffer.append(tuple(self.to_row(record)))

    def snapshot(self, checkpoint_id: int) -> Any:
        if self.buffer:
            self.pending.append((checkpoint_id, self.buffer))
            self.buffer = []
        return {"subtask": self.subtask_index, "pending": list(self.pending)}

    def _commit(self, checkpoint_id: int, rows: list[tuple], subtask: int | None = None) -> None:
        assert self._conn is not None
        cols = ", ".join(_ident(c) for c in self.columns)
        marks = ", ".join(["%s"] * len(self.columns))
        with self._conn.transaction():
            cur = self._conn.execute(
                f"INSERT INTO {MARKERS} (sink, subtask, checkpoint_id) VALUES (%s, %s, %s) "
                "ON CONFLICT DO NOTHING RETURNING checkpoint_id",
                (self.name, self.subtask_index if subtask is None else subtask, checkpoint_id),
            )
            if cur.fetchone() is None:
                return  # committed before (by the attempt that failed after committing)
            with self._conn.cursor() as c:
                c.executemany(f"INSERT INTO {_ident(self.table)} ({cols}) VALUES ({marks})", rows)
        self.committed_rows += len(rows)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        keep = []
        for cid, rows in self.pending:
            if cid <= checkpoint_id:
                self._commit(cid, rows)
            else:
                keep.append((cid, rows))
        self.pending = keep

    def restore(self, state: Any) -> None:
        for cid, rows in state["pending"]:  # part of a completed checkpoint, written by subtask state["subtask"]
            self._commit(cid, [tuple(r) for r in rows], state.get("subtask"))
        self.pending = []

    def close(self) -> Any:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        return {"committed_rows": self.committed_rows, "uncommitted_rows": len(self.buffer)}
