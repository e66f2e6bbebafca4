"""Alembic environment: runs migrations with the async engine of the configured URL, one migrator at a time."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.models import Base

config = context.config
target_metadata = Base.metadata
ADVISORY_LOCK = 0x0F7A4E  # serializes replicas that start at the same time (PostgreSQL)


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        from app.settings import Settings

        url = Settings().effective_database_url
    return url


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _online() -> None:
    url = _url()
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            postgres = conn.dialect.name == "postgresql"
            if postgres:
                await conn.execute(text(f"SELECT pg_advisory_lock({ADVISORY_LOCK})"))
                await conn.commit()
            try:
                await conn.run_sync(_run)
                await conn.commit()
            finally:
                if postgres:
                    await conn.execute(text(f"SELECT pg_advisory_unlock({ADVISORY_LOCK})"))
                    await conn.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_online())
