"""The SQL a coordinator's engine runs while a block runs, for tests that check what a transaction does."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import event


@contextmanager
def recorded_statements(api) -> Iterator[list[str]]:
    """Every statement the coordinator's engine runs inside the block: whitespace collapsed, upper case."""
    statements: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        statements.append(" ".join(statement.split()).upper())

    engine = api.ctx.db.engine.sync_engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", record)
