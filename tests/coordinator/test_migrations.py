"""Alembic migrations on SQLite and PostgreSQL: one head, upgrade from empty, downgrade with data, upgrade again,
and the migrated schema equals the models."""

from __future__ import annotations

import asyncio

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.migrate import alembic_config, downgrade, upgrade
from app.db.models import Base
from app.settings import Settings


@pytest.fixture(params=["sqlite", "postgres"])
def db_settings(request, tmp_path) -> Settings:
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    return Settings(data_dir=tmp_path, database_url=url)


def test_there_is_a_single_head():
    script = ScriptDirectory.from_config(alembic_config("sqlite+aiosqlite:///:memory:"))
    assert len(script.get_heads()) == 1


async def _tables_and_diff(url: str):
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:

            def inspect_sync(sync_conn):
                names = set(inspect(sync_conn).get_table_names())
                mc = MigrationContext.configure(sync_conn, opts={"compare_type": True})
                return names, compare_metadata(mc, Base.metadata)

            return await conn.run_sync(inspect_sync)
    finally:
        await engine.dispose()


async def _count(url: str, table: str) -> int:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            return (await conn.execute(text(f"SELECT count(*) FROM {table}"))).scalar_one()
    finally:
        await engine.dispose()


async def test_upgrade_downgrade_with_data_and_upgrade_again(db_settings: Settings, make_api):
    url = db_settings.effective_database_url
    await asyncio.to_thread(upgrade, db_settings)
    tables, diff = await _tables_and_diff(url)
    assert {"jobs", "attempts", "checkpoints", "acks", "blobs", "events", "alembic_version"} <= tables
    assert diff == [], f"models and migrations differ: {diff}"

    # put real data in through the app, then downgrade with it in place
    async with make_api(database_url=url) as api:
        job = await api.job()
        await api.trigger(job["id"])
        await api.ack_all(job, 1)
    assert await _count(url, "acks") == 4
    await asyncio.to_thread(downgrade, db_settings, "base")
    tables, _ = await _tables_and_diff(url)
    assert tables <= {"alembic_version"}
    await asyncio.to_thread(upgrade, db_settings)
    tables, diff = await _tables_and_diff(url)
    assert "checkpoints" in tables and diff == []
    async with make_api(database_url=url) as api:
        job = await api.job()
        assert (await api.trigger(job["id"])).status_code == 201
