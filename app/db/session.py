"""The database engine and the one session context that owns begin, commit, rollback and error translation."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from sqlalchemy import event, text
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from app.errors import Conflict, Invalid, Unavailable
from app.registry import SchemeRegistry

log = logging.getLogger(__name__)

# SQLSTATEs a retry of the same transaction may succeed after: deadlock, serialization failure, lock timeout,
# and the connection classes (08: connection exception; 57P01-03: the server shut down or restarts).
TRANSIENT_SQLSTATES = {"40P01", "40001", "55P03", "57P01", "57P02", "57P03"}


class TransientDatabaseError(Exception):
    """A transaction failed for a reason that a retry of the whole request may not meet again (a deadlock, a
    serialization failure, a lost connection, a locked SQLite file). Not a DomainError on purpose: it passes the
    route's error handlers up to the retry guard (`app/api/guards.py`), which runs the request again a bounded
    number of times and otherwise answers 503 with Retry-After."""

    def unavailable(self) -> Unavailable:
        return Unavailable(f"the database is busy or unavailable ({self}); retry")


class LockWaitTimeout(TransientDatabaseError):
    """A lock was not granted within the transaction's `lock_timeout` (SQLSTATE 55P03). Expected where a caller
    bounds its wait on purpose (`app.domain.context.lock_job`'s `wait_ms`): logged at debug, not as a warning."""


def _sqlstate(exc: DBAPIError) -> str | None:
    return getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)


def is_data_exception(exc: BaseException) -> bool:
    """A value the database cannot hold (SQLSTATE class 22: a NUL character in text, a token that is not JSON such
    as NaN, a number out of range). asyncpg's errors of that class do not arrive as SQLAlchemy's DataError."""
    if isinstance(exc, DataError):
        return True
    if isinstance(exc, DBAPIError) and not isinstance(exc, (OperationalError, InterfaceError)):
        code = _sqlstate(exc)
        return code is not None and code.startswith("22")
    return False


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, (PoolTimeout, ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated or isinstance(exc, (OperationalError, InterfaceError)):
            return True
        code = _sqlstate(exc)
        return code is not None and (code in TRANSIENT_SQLSTATES or code.startswith("08"))
    return False


def _sqlite_engine(url: str, pool_size: int = 10, timeout: float = 10.0) -> AsyncEngine:
    """SQLite in WAL mode with IMMEDIATE write transactions (one writer at a time, no mid-transaction upgrades)."""
    if True:
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


def _postgres_engine(url: str, pool_size: int = 10, timeout: float = 10.0) -> AsyncEngine:
    """`timeout` bounds a connection's opening, every statement and the wait for a pooled connection: a server that
    does not answer (a network partition: no reset, no refusal) is then a transient failure, not a hang."""
    return create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_timeout=timeout,
        connect_args={"timeout": timeout, "command_timeout": timeout},
    )


DATABASES: SchemeRegistry[AsyncEngine] = SchemeRegistry(
    "database", "OVERTAKE_DATABASE_URL", "sqlite+aiosqlite:///file.db or postgresql+asyncpg://user@host:port/db"
)
DATABASES.register("sqlite+aiosqlite", _sqlite_engine)
DATABASES.register("postgresql+asyncpg", _postgres_engine)


def make_engine(url: str, pool_size: int = 10, timeout: float = 10.0) -> AsyncEngine:
    """An engine for the URL's dialect, from the table of known database schemes."""
    return DATABASES.create(url, pool_size=pool_size, timeout=timeout)


class Database:
    """Owns the engine and hands out transactional sessions."""

    def __init__(self, url: str, pool_size: int = 10, timeout: float = 10.0) -> None:
        self.url = url
        self.engine = make_engine(url, pool_size, timeout)
        self.is_sqlite = url.startswith("sqlite")
        self._writer = async_sessionmaker(self.engine, expire_on_commit=False)
        self._reader = async_sessionmaker(
            self.engine.execution_options(overtake_readonly=True), expire_on_commit=False
        )

    @asynccontextmanager
    async def session(self, readonly: bool = False) -> AsyncIterator[AsyncSession]:
        """One transaction: committed when the block ends, rolled back on any error.

        Integrity errors become 409s, values the database cannot hold 422s, and transient failures (deadlock,
        serialization failure, lost connection) a TransientDatabaseError that the request is retried after.
        """
        maker = self._reader if readonly else self._writer
        async with maker() as session:
            try:
                async with session.begin():
                    yield session
            except IntegrityError as exc:
                log.info("integrity error: %s", exc.orig)
                raise Conflict(f"the request conflicts with stored data: {exc.orig}") from exc
            except Exception as exc:
                if is_data_exception(exc):
                    log.info("data error: %s", exc.orig)
                    raise Invalid(f"a value does not fit the database: {exc.orig}") from exc
                if isinstance(exc, DBAPIError) and _sqlstate(exc) == "55P03":
                    log.debug("lock wait timed out: %s", exc.orig)
                    raise LockWaitTimeout(f"{type(exc).__name__}: {exc.orig}") from exc
                if is_transient(exc):
                    log.warning("transient database error: %s", getattr(exc, "orig", exc))
                    raise TransientDatabaseError(f"{type(exc).__name__}: {getattr(exc, 'orig', exc)}") from exc
                raise

    async def ping(self) -> None:
        async with self.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def dispose(self) -> None:
        await self.engine.dispose()
