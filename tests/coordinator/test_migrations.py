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
    await asyncio.to_thread(upgrade, db_settings.effective_database_url)
    tables, diff = await _tables_and_diff(url)
    assert {"jobs", "attempts", "checkpoints", "acks", "blobs", "events", "alembic_version"} <= tables
    assert diff == [], f"models and migrations differ: {diff}"

    # put real data in through the app, then downgrade with it in place
    async with make_api(database_url=url) as api:
        job = await api.job()
        await api.trigger(job["id"])
        await api.ack_all(job, 1)
    assert await _count(url, "acks") == 4
    await asyncio.to_thread(downgrade, db_settings.effective_database_url, "base")
    tables, _ = await _tables_and_diff(url)
    assert tables <= {"alembic_version"}
    await asyncio.to_thread(upgrade, db_settings.effective_database_url)
    tables, diff = await _tables_and_diff(url)
    assert "checkpoints" in tables and diff == []
    async with make_api(database_url=url) as api:
        job = await api.job()
        assert (await api.trigger(job["id"])).status_code == 201


async def test_job_ids_beyond_32_bits_are_stored_on_both_databases(db_settings: Settings, make_api):
    url = db_settings.effective_database_url
    await asyncio.to_thread(upgrade, db_settings.effective_database_url)
    big = 2**40
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO jobs (id, name, kind, status, graph, config, labels, num_subtasks, next_checkpoint_id,"
                    " event_seq, consecutive_failures, created_at, updated_at) VALUES (:id, 'big', 'pipeline',"
                    " 'CREATED', '{\"vertices\": [{\"id\": \"a\", \"parallelism\": 1, \"max_parallelism\": 128,"
                    " \"kind\": \"operator\", \"keyed\": false}], \"edges\": []}', '{}', '{}', 1, 1, 0, 0, 0, 0)"
                ),
                {"id": big},
            )
            if conn.dialect.name == "postgresql":  # an explicit id does not move the sequence; move it
                await conn.execute(text("SELECT setval('jobs_id_seq', :id)"), {"id": big})
    finally:
        await engine.dispose()
    async with make_api(database_url=url) as api:
        started = await api.client.post(f"/api/v1/jobs/{big}/attempts", json={})
        assert started.status_code == 201, started.text
        assert (await api.trigger(big)).status_code == 201
        assert (await api.ack(big, 1, "a", 0)).json()["status"] == "COMPLETED"
        created = await api.client.post(
            "/api/v1/jobs", json={"name": "next", "graph": {"vertices": [{"id": "a", "parallelism": 1}]}}
        )
        assert created.status_code == 201 and created.json()["id"] > big  # the id sequence is 64-bit too


async def test_stored_configs_beyond_todays_bounds_are_brought_within_them(db_settings: Settings, make_api):
    url = db_settings.effective_database_url
    await asyncio.to_thread(upgrade, db_settings.effective_database_url, "0004")
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO jobs (name, kind, status, graph, config, labels, num_subtasks, next_checkpoint_id,"
                    " event_seq, consecutive_failures, created_at, updated_at) VALUES ('old', 'pipeline', 'CREATED',"
                    " '{\"vertices\": [{\"id\": \"a\", \"parallelism\": 1, \"max_parallelism\": 128,"
                    " \"kind\": \"operator\", \"keyed\": false}], \"edges\": []}',"
                    " '{\"timeout\": 10000000000000000000, \"interval\": 50, \"policy\": \"aligned_then_unaligned\","
                    " \"alignment_timeout\": 3000000000}', '{}', 1, 1, 0, 0, 0, 0)"
                )
            )
    finally:
        await engine.dispose()
    await asyncio.to_thread(upgrade, db_settings.effective_database_url)
    async with make_api(database_url=url) as api:
        job = (await api.client.get("/api/v1/jobs")).json()["items"][0]
        week = 7 * 24 * 3600 * 1000
        assert job["checkpoint"]["timeout"] == week and job["checkpoint"]["alignment_timeout"] == week - 1


async def test_blobs_stored_before_the_per_checkpoint_layout_keep_working(db_settings: Settings, make_api):
    """Rows from before 0007 have no key: their object is job-<id>/<blob id>. Plans read them from the store, the
    coordinator serves them, and blobs an older coordinator was deleting when it stopped are collected."""
    url = db_settings.effective_database_url
    await asyncio.to_thread(upgrade, url)
    async with make_api(database_url=url) as api:
        job = await api.job({"a": 1}, retained=2)
        blobs = {}
        for cp in (1, 2):
            await api.trigger(job["id"])
            info = (await api.upload(job["id"], cp, "a", 0, f"state {cp}".encode(), kind="operator")).json()
            ref = {k: info[k] for k in ("blob_id", "sha256", "size")}
            assert (await api.ack(job["id"], cp, "a", 0, operator_state=ref)).json()["status"] == "COMPLETED"
            blobs[cp] = info["blob_id"]
        root = api.ctx.store.root
    await asyncio.to_thread(downgrade, url, "0006")
    for cp, blob_id in blobs.items():  # where an older coordinator kept them
        (root / f"job-{job['id']}/cp-{cp:012d}/{blob_id}").rename(root / f"job-{job['id']}/{blob_id}")
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:  # it was collecting checkpoint 1 when it stopped
            await conn.execute(text("UPDATE blobs SET status = 'deleting' WHERE checkpoint_id = 1"))
            await conn.execute(text("UPDATE checkpoints SET discarded = true WHERE id = 1"))
    finally:
        await engine.dispose()
    await asyncio.to_thread(upgrade, url)
    async with make_api(database_url=url) as api:
        plan = (await api.client.get(f"/api/v1/jobs/{job['id']}/restore-plan")).json()
        assert plan["checkpoint_id"] == 2 and plan["fallbacks"] == []
        (loc,) = plan["subtasks"][0]["blobs"]
        assert loc["url"] == (root / f"job-{job['id']}/{blobs[2]}").as_uri() and loc["offset"] == 0
        served = await api.client.get(f"/api/v1/jobs/{job['id']}/blobs/{blobs[2]}")
        assert served.status_code == 200 and served.content == b"state 2"
        await api.ctx.sweep_state()  # (the scheduler's first pass may have done it already)
        assert not (root / f"job-{job['id']}/{blobs[1]}").exists()
        assert (root / f"job-{job['id']}/{blobs[2]}").exists()
        assert await _count(url, "blobs") == 1
