"""The database engine and the one session context that owns begin, commit, rollback and error translation."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from sqlalchemy import event, text
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from app.errors import Conflict, Unavailable

log = logging.getLogger(__name__)


def make_engine(url: str, pool_size: int = 10) -> AsyncEngine:
    """An engine for the URL's dialect: SQLite in WAL mode with IMMEDIATE write transactions, or PostgreSQL."""
    if url.startswith("sqlite"):
        path = url.split(":///", 1)[1] if ":///" in url else ""
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url, connect_args={"timeout": 30})
        sync = engine.sync_engine

        @event.listens_for(sync, "connect")
        def _on_connect(dbapi_conn, _record):  # pragma: no cover - exercised by every sqlite test
            # Let SQLAlchemy, not the driver, decide when transactions begin (pysqlite's recipe).
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(sync, "begin")
        def _on_begin(conn):  # pragma: no cover
            # Writers take the write lock up front: no lock upgrades, no SQLITE_BUSY deadlocks mid-transaction.
            if conn.get_execution_options().get("overtake_readonly"):
                conn.exec_driver_sql("BEGIN")
            else:
                conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_async_engine(url, pool_size=pool_size, max_overflow=pool_size)


class Database:
    """Owns the engine and hands out transactional sessions."""

    def __init__(self, url: str, pool_size: int = 10) -> None:
        self.url = url
        self.engine = make_engine(url, pool_size)
        self.is_sqlite = url.startswith("sqlite")
        self._writer = async_sessionmaker(self.engine, expire_on_commit=False)
        self._reader = async_sessionmaker(
            self.engine.execution_options(overtake_readonly=True), expire_on_commit=False
        )

    @asynccontextmanager
    async def session(self, readonly: bool = False) -> AsyncIterator[AsyncSession]:
        """One transaction: committed when the block ends, rolled back on any error.

        Integrity errors become 409s; a lost connection becomes a 503 the client may retry.
        """
        maker = self._reader if readonly else self._writer
        async with maker() as session:
            try:
                async with session.begin():
                    yield session
            except IntegrityError as exc:
                log.info("integrity error: %s", exc.orig)
                raise Conflict(f"the request conflicts with stored data: {exc.orig}") from exc
            except OperationalError as exc:
                log.warning("database unavailable: %s", exc.orig)
                raise Unavailable(f"the database is unavailable, retry: {exc.orig}") from exc
            except DBAPIError as exc:
                if exc.connection_invalidated:
                    raise Unavailable(f"the database connection was lost, retry: {exc.orig}") from exc
                raise

    async def ping(self) -> None:
        async with self.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def dispose(self) -> None:
        await self.engine.dispose()
