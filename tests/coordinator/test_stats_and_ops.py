"""Flink-style checkpoint statistics, health/readiness/metrics, offline Swagger UI, and the fsspec blob store."""

from __future__ import annotations

import hashlib

import pytest

from app.blobstore import FsspecBlobStore, blob_key


async def test_statistics_summarize_completed_checkpoints_with_flinks_fields(api):
    job = await api.job(tolerable_failures=10, max_concurrent=1)
    sizes = []
    for n in range(1, 6):
        await api.trigger(job["id"], policy="unaligned" if n % 2 else "aligned")
        for v, i in (("src", 0), ("src", 1), ("agg", 0), ("agg", 1)):
            metrics = {
                "persisted_data": n * 10 if v == "agg" else 0,
                "processed_data": 100,
                "alignment_duration": n,
                "unaligned": bool(n % 2) and v == "agg",
                "sync_duration": 2,
                "async_duration": 5,
                "start_delay": 1,
            }
            assert (await api.ack(job["id"], n, v, i, metrics=metrics)).status_code == 200
        sizes.append(n * 20)
    await api.trigger(job["id"])
    await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/6/declines",
        json={"attempt": 1, "vertex": "src", "subtask_index": 0, "reason": "x"},
    )
    await api.client.post(f"/api/v1/jobs/{job['id']}/savepoints", json={})
    stats = (await api.client.get(f"/api/v1/jobs/{job['id']}/checkpoints/stats")).json()
    assert stats["counts"] == {
        "total": 7, "in_progress": 1, "completed": 5, "failed": 1, "not_finished": 0, "aborted": 1, "savepoints": 1,
        "interrupted": 0,
    }
    s = stats["summary"]
    assert s["persisted_data"]["min"] == 20 and s["persisted_data"]["max"] == 100
    assert s["persisted_data"]["avg"] == sum(sizes) / 5 and s["persisted_data"]["p50"] == 60
    assert s["processed_data"]["p99"] == 400
    assert s["alignment_duration"]["max"] == 5
    assert s["end_to_end_duration"]["min"] >= 0
    assert stats["latest"]["completed"]["id"] == 5 and stats["latest"]["failed"]["id"] == 6
    assert stats["latest"]["savepoint"] is None  # pending savepoints are not "latest completed"
    assert [c["checkpoint_type"] for c in stats["history"]][:3] == ["savepoint", "aligned", "unaligned"]
    detail = await api.checkpoint(job["id"], 5)
    sub = {(x["vertex"], x["subtask_index"]): x for x in detail["subtasks"]}
    assert sub[("agg", 1)]["unaligned"] is True and sub[("src", 0)]["unaligned"] is False
    assert sub[("agg", 1)]["persisted_data"] == 50 and sub[("agg", 1)]["sync_duration"] == 2
    assert detail["checkpoint_type"] == "unaligned" and detail["end_to_end_duration"] >= 0


async def test_an_interrupted_checkpoint_is_counted_once_in_the_total(api):
    job = await api.job()
    assert (await api.trigger(job["id"])).status_code == 201
    assert (await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={})).status_code == 201
    stats = (await api.client.get(f"/api/v1/jobs/{job['id']}/checkpoints/stats")).json()
    assert stats["counts"] == {
        "total": 1, "in_progress": 0, "completed": 0, "failed": 0, "not_finished": 1, "aborted": 1, "savepoints": 0,
        "interrupted": 1,
    }


async def test_a_jobs_checkpoints_are_counted_in_one_pass(api):
    """Counting by status, the interrupted ones and the savepoints took three scans of a job's checkpoints (every one
    of a long history) for the statistics, two for a job's view; one now."""
    from tests.coordinator._sql import recorded_statements

    job = await api.job()
    assert (await api.trigger(job["id"])).status_code == 201
    for url in (f"/api/v1/jobs/{job['id']}/checkpoints/stats", f"/api/v1/jobs/{job['id']}", "/api/v1/jobs"):
        with recorded_statements(api) as statements:
            assert (await api.client.get(url)).status_code == 200
        scans = [st for st in statements if "FROM CHECKPOINTS" in st and "COUNT(" in st]
        assert len(scans) == 1, (url, scans)


async def test_statistics_load_only_the_checkpoints_they_show(api):
    """The summary needs six figures of each completed checkpoint (up to 100,000 of them), not whole rows: rows are
    loaded for the history and the latest checkpoints only, however long the job's history is."""
    from sqlalchemy import event

    from app.db.models import CheckpointRow

    job = await api.job(parallelism={"src": 1}, retained=100)
    for n in range(1, 21):
        assert (await api.trigger(job["id"])).status_code == 201
        assert (await api.ack(job["id"], n, "src", 0, metrics={"persisted_data": n})).status_code == 200
    loaded = []

    def load(target, context):
        loaded.append(target.id)

    event.listen(CheckpointRow, "load", load)
    try:
        stats = (await api.client.get(f"/api/v1/jobs/{job['id']}/checkpoints/stats", params={"history": 2})).json()
    finally:
        event.remove(CheckpointRow, "load", load)
    assert stats["counts"]["completed"] == 20 and stats["summary"]["persisted_data"]["max"] == 20
    assert [c["id"] for c in stats["history"]] == [20, 19]
    assert set(loaded) <= {19, 20}, loaded


async def test_history_is_paged_newest_first(api):
    job = await api.job(max_concurrent=100)
    for _ in range(7):
        await api.trigger(job["id"])
    page = (
        await api.client.get(f"/api/v1/jobs/{job['id']}/checkpoints", params={"limit": 3, "offset": 2})
    ).json()
    assert page["total"] == 7 and [c["id"] for c in page["items"]] == [5, 4, 3]
    bad = await api.client.get(f"/api/v1/jobs/{job['id']}/checkpoints", params={"limit": 0})
    assert bad.status_code == 422 and "limit" in bad.json()["error"]["message"]


async def test_health_readiness_and_metrics(sqlite_api):
    api = sqlite_api
    assert (await api.client.get("/healthz")).json() == {"status": "ok", "checks": {}}
    ready = (await api.client.get("/readyz")).json()
    assert ready["status"] == "ok" and set(ready["checks"]) == {"database", "event_bus", "blob_store"}
    job = await api.job()
    await api.trigger(job["id"])
    commits = _sample((await api.client.get("/metrics")).text, "overtake_ack_commit_seconds_count")
    await api.ack_all(job, 1)
    metrics = (await api.client.get("/metrics")).text
    assert 'overtake_checkpoints_total{outcome="completed"}' in metrics
    assert "overtake_checkpoint_duration_seconds_bucket" in metrics
    assert 'overtake_acks_total{result="recorded"}' in metrics
    # every ack transaction is timed (the metric the ack-path benchmark reads)
    assert _sample(metrics, "overtake_ack_commit_seconds_count") > commits
    assert _sample(metrics, "overtake_ack_commit_seconds_sum") > 0


def _sample(metrics: str, name: str) -> float:
    values = [float(line.split()[1]) for line in metrics.splitlines() if line.split(" ", 1)[0] == name]
    assert len(values) == 1, f"{name} is not among the metrics once"
    return values[0]


async def test_readiness_reports_an_unreachable_database(sqlite_api):
    api = sqlite_api
    await api.ctx.db.dispose()  # drop pooled connections; new ones can no longer be made
    api.ctx.db.engine.sync_engine.pool._creator = _fail
    r = await api.client.get("/readyz")
    assert r.status_code == 503 and r.json()["checks"]["database"].startswith("unavailable")


def _fail(*_a, **_k):
    raise OSError("database unreachable (test)")


async def test_swagger_ui_is_served_without_a_cdn(sqlite_api):
    html = (await sqlite_api.client.get("/docs")).text
    assert "swagger-ui-bundle.js" in html and "cdn" not in html.lower()
    js = await sqlite_api.client.get("/static-offline-docs/swagger-ui-bundle.js")
    assert js.status_code == 200 and len(js.content) > 100_000


async def test_unknown_routes_get_the_json_error_shape(sqlite_api):
    r = await sqlite_api.client.get("/api/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


@pytest.fixture
def memory_store(tmp_path):
    store = FsspecBlobStore(f"memory://overtake-test-{tmp_path.name}", staging_dir=tmp_path / "staging")
    yield store
    store.fs.rm(store.root, recursive=True)


async def test_fsspec_store_stages_verifies_and_serves_ranges(memory_store):
    data = b"0123456789" * 1000

    async def body():
        for i in range(0, len(data), 999):
            yield data[i : i + 999]

    staged = await memory_store.stage(body(), hashlib.sha256(data).hexdigest(), 1 << 20)
    key = blob_key(1, "ab" * 16)
    await memory_store.commit(staged, key)
    assert not staged.path.exists()
    assert await memory_store.size(key) == len(data)
    assert await memory_store.sha256(key) == hashlib.sha256(data).hexdigest()
    part = b"".join([c async for c in memory_store.read_range(key, 10, 19)])
    assert part == data[10:20]
    await memory_store.delete(key)
    assert await memory_store.size(key) is None


async def test_the_live_view_walks_the_subtasks_reports_once_not_once_per_vertex(sqlite_api, monkeypatch):
    """Each vertex picked its subtasks out of every report of the job: 1,000 vertices of 2 subtasks took ~170 ms a
    view. The reports are grouped by vertex once."""
    from app.domain import live_metrics

    api = sqlite_api
    job = await api.job(parallelism={f"v{n}": 2 for n in range(10)}, edges=[])
    for n in range(10):
        for i in range(2):
            r = await api.client.post(
                f"/api/v1/jobs/{job['id']}/attempts/1/subtasks/v{n}/{i}/metrics",
                json={"timestamp": 1, "metrics": {"records_in_per_second": float(n), "backpressure": 0.5}},
            )
            assert r.status_code == 204, r.text
    walks = []

    class Counted(dict):
        def items(self):
            walks.append(1)
            return super().items()

    latest = live_metrics.LiveMetricsStore.latest
    monkeypatch.setattr(live_metrics.LiveMetricsStore, "latest", lambda *a: Counted(latest(*a)))
    view = (await api.client.get(f"/api/v1/jobs/{job['id']}/metrics")).json()
    assert [(v["vertex"], v["reporting"], v["records_in_per_second"]) for v in view["vertices"]] == [
        (f"v{n}", 2, 2.0 * n) for n in range(10)
    ]
    assert len(walks) == 1


async def test_metrics_reports_read_their_job_once_per_interval_not_once_per_report(make_api, monkeypatch):
    """Every subtask reports about once a second: a job of 2,000 subtasks cost 2,000 reads of its row a second
    (and as many token checks). Reports are checked against the job as read within `FACTS_TTL`; a new attempt, or
    the job's end, is read at once when its event arrives; a task token reports only for its own attempt."""
    from app.domain import live_metrics

    monkeypatch.setattr(live_metrics, "FACTS_TTL", 3600.0)  # no report here outlives what was read
    reads = []
    real = live_metrics.get_job_or_404

    async def counted(s, job_id, *a, **k):
        reads.append(job_id)
        return await real(s, job_id, *a, **k)

    monkeypatch.setattr(live_metrics, "get_job_or_404", counted)
    admin = {"Authorization": "Bearer admin-secret"}
    async with make_api(admin_token="admin-secret") as api:
        c = api.client
        body = {"name": "j", "graph": {"vertices": [{"id": "a", "parallelism": 20}]}}
        job = (await c.post("/api/v1/jobs", json=body, headers=admin)).json()["id"]
        token = (await c.post(f"/api/v1/jobs/{job}/attempts", json={}, headers=admin)).json()["task_token"]
        task = {"Authorization": f"Bearer {token}"}

        def path(attempt, i):
            return f"/api/v1/jobs/{job}/attempts/{attempt}/subtasks/a/{i}/metrics"

        report = {"timestamp": 1, "metrics": {"records_in_per_second": 1.0}}
        for i in range(20):
            assert (await c.post(path(1, i), json=report, headers=task)).status_code == 204
        assert reads == [job]
        r = await c.post(path(2, 0), json=report, headers=task)  # not the token's attempt
        assert r.status_code == 401 and "attempt 1" in r.json()["error"]["message"], r.text

        token2 = (await c.post(f"/api/v1/jobs/{job}/attempts", json={}, headers=admin)).json()["task_token"]
        r = await c.post(path(1, 0), json=report, headers=task)  # the old attempt's token, read again at once
        assert r.status_code == 401 and "attempt 2" in r.json()["error"]["message"], r.text
        for i in range(20):
            r = await c.post(path(2, i), json=report, headers={"Authorization": f"Bearer {token2}"})
            assert r.status_code == 204, r.text
        assert len(reads) == 2
        assert (await c.post(f"/api/v1/jobs/{job}/cancel", headers=admin)).status_code == 200
        r = await c.post(path(2, 0), json=report, headers=admin)
        assert r.status_code == 409 and "CANCELLED" in r.json()["error"]["message"], r.text


async def test_the_coordinator_warns_at_start_when_postgresql_runs_without_autovacuum(make_api, pg_url, caplog):
    """Without autovacuum PostgreSQL never analyzes the coordinator's tables, and plans made on them while empty
    make each checkpoint cost more as its job's history grows: the operator is told at start, and only then."""
    from sqlalchemy import text

    with caplog.at_level("WARNING"):
        async with make_api(database_url=pg_url) as api:
            async with api.ctx.db.session(readonly=True) as s:
                autovacuum = (await s.execute(text("SHOW autovacuum"))).scalar()
    warned = [rec.getMessage() for rec in caplog.records if "autovacuum is off" in rec.getMessage()]
    assert bool(warned) == (autovacuum == "off"), (autovacuum, warned)
    assert all("ANALYZE" in message for message in warned)
