"""In-process coordinator fixtures: the real app and a real database (SQLite or PostgreSQL), called through ASGI."""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from app.main import create_app
from app.settings import Settings


@dataclass
class Api:
    client: httpx.AsyncClient
    app: Any
    backend: str

    @property
    def ctx(self):
        return self.app.state.ctx

    async def job(
        self, parallelism: dict[str, int] | None = None, edges=None, start: bool = True, **config
    ) -> dict:
        """Register a job (source -> agg by default) and, unless start=False, start attempt 1."""
        parallelism = parallelism or {"src": 2, "agg": 2}
        names = list(parallelism)
        vertices = [
            {"id": n, "parallelism": p, "max_parallelism": max(16, p), "keyed": i > 0}
            for i, (n, p) in enumerate(parallelism.items())
        ]
        if edges is None:
            edges = [
                {"source": a, "target": b, "partitioning": "hash"}
                for a, b in zip(names, names[1:], strict=False)
            ]
        body = {"name": "job", "graph": {"vertices": vertices, "edges": edges}, "checkpoint": config}
        r = await self.client.post("/api/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        job = r.json()
        if start:
            a = await self.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={})
            assert a.status_code == 201, a.text
            job["attempt"] = a.json()
        return job

    async def trigger(self, job_id: int, **body) -> httpx.Response:
        return await self.client.post(f"/api/v1/jobs/{job_id}/checkpoints", json=body)

    async def upload(
        self, job_id: int, cp: int, vertex: str, index: int, data: bytes, kind="channel", attempt=1
    ):
        return await self.client.post(
            f"/api/v1/jobs/{job_id}/checkpoints/{cp}/blobs",
            params={"attempt": attempt, "vertex": vertex, "subtask_index": index, "kind": kind},
            content=data,
            headers={"X-Overtake-Sha256": hashlib.sha256(data).hexdigest()},
        )

    async def ack(
        self, job_id: int, cp: int, vertex: str, index: int, attempt: int = 1, **extra
    ) -> httpx.Response:
        body = {"attempt": attempt, "vertex": vertex, "subtask_index": index, **extra}
        return await self.client.post(f"/api/v1/jobs/{job_id}/checkpoints/{cp}/acks", json=body)

    async def ack_all(
        self, job: dict, cp: int, attempt: int = 1, skip: set | None = None
    ) -> list[httpx.Response]:
        out = []
        for v in job["graph"]["vertices"]:
            for i in range(v["parallelism"]):
                if skip and (v["id"], i) in skip:
                    continue
                out.append(await self.ack(job["id"], cp, v["id"], i, attempt))
        return out

    async def checkpoint(self, job_id: int, cp: int) -> dict:
        r = await self.client.get(f"/api/v1/jobs/{job_id}/checkpoints/{cp}")
        assert r.status_code == 200, r.text
        return r.json()

    async def events(self, job_id: int, after: int = 0) -> list[dict]:
        r = await self.client.get(f"/api/v1/jobs/{job_id}/events/history", params={"after": after})
        assert r.status_code == 200, r.text
        return r.json()

    async def wait_for(self, predicate, timeout: float = 10.0, what: str = "condition"):
        """Poll an async predicate until it returns a truthy value (not a timing assertion: a deadline)."""
        deadline = time.monotonic() + timeout
        while True:
            value = await predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"gave up waiting for {what}")
            await asyncio.sleep(0.02)


def _settings(tmp_path, database_url: str | None, **extra) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        log_json=False,
        log_level="WARNING",
        **{"scheduler_tick": 0.02, **extra},
    )


async def _serve(settings: Settings, backend: str):
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://coordinator", timeout=30
        ) as client:
            yield Api(client, app, backend)


@pytest.fixture(params=["sqlite", "postgres"])
async def api(request, tmp_path):
    """The coordinator on SQLite and on PostgreSQL: rules must hold on both."""
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    async for a in _serve(_settings(tmp_path, url), request.param):
        yield a


@pytest.fixture(params=["file-sqlite", "s3-sqlite", "file-postgres"])
async def store_api(request, tmp_path):
    """The coordinator with its blob store on a shared directory (file://) and on an S3 server (s3://, through
    s3fs), on SQLite, and the file store on PostgreSQL: subtasks write their state into it themselves."""
    store, db = request.param.split("-")
    url = request.getfixturevalue("pg_url") if db == "postgres" else None
    extra = {"blob_url": request.getfixturevalue("s3_bucket")} if store == "s3" else {}
    async for a in _serve(_settings(tmp_path, url, **extra), request.param):
        yield a


@pytest.fixture
async def sqlite_api(tmp_path):
    async for a in _serve(_settings(tmp_path, None), "sqlite"):
        yield a


@pytest.fixture
def make_api(tmp_path):
    """Build an API with custom settings: `async with make_api(admin_token=...) as api`."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def factory(database_url: str | None = None, **extra):
        gen = _serve(_settings(tmp_path, database_url, **extra), "custom")
        a = await gen.__anext__()
        try:
            yield a
        finally:
            await gen.aclose()

    return factory
