"""Safe defaults: a task token works only while its attempt is current and its job runs; without auth, a browser
page of another origin cannot change anything, while the UI's own requests and non-browser clients can."""

from __future__ import annotations

import hashlib

import pytest

ADMIN = "s3cret-admin"
JOB = {"name": "j", "graph": {"vertices": [{"id": "a", "parallelism": 1}]}, "checkpoint": {"max_concurrent": 10}}


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def secured(make_api):
    async with make_api(admin_token=ADMIN) as api:
        yield api


async def _job_and_token(api) -> tuple[int, str]:
    job = (await api.client.post("/api/v1/jobs", json=JOB, headers=bearer(ADMIN))).json()
    attempt = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={}, headers=bearer(ADMIN))
    return job["id"], attempt.json()["task_token"]


async def test_the_current_attempts_token_works_for_everything_its_runtime_does(secured):
    c = secured.client
    job_id, token = await _job_and_token(secured)
    h = bearer(token)
    base = f"/api/v1/jobs/{job_id}"
    assert (await c.post(f"{base}/attempts/1/running", json={"vertex": "a", "subtask_index": 0}, headers=h)).status_code == 200
    assert (await c.post(f"{base}/checkpoints", json={}, headers=h)).status_code == 201
    data = b"state"
    up = await c.post(
        f"{base}/checkpoints/1/blobs",
        params={"attempt": 1, "vertex": "a", "subtask_index": 0, "kind": "operator"},
        content=data,
        headers={**h, "X-Overtake-Sha256": hashlib.sha256(data).hexdigest()},
    )
    assert up.status_code == 201
    assert (await c.get(f"{base}/blobs/{up.json()['blob_id']}", headers=h)).content == data
    ref = {"blob_id": up.json()["blob_id"], "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    ack = {"attempt": 1, "vertex": "a", "subtask_index": 0, "operator_state": ref}
    assert (await c.post(f"{base}/checkpoints/1/acks", json=ack, headers=h)).status_code == 200
    assert (await c.post(f"{base}/checkpoints", json={}, headers=h)).status_code == 201
    decline = {"attempt": 1, "vertex": "a", "subtask_index": 0, "reason": "test"}
    assert (await c.post(f"{base}/checkpoints/2/declines", json=decline, headers=h)).status_code == 200
    assert (await c.get(f"{base}/events/history", headers=h)).status_code == 200
    assert (await c.post(f"{base}/finish", json={"status": "FINISHED", "attempt": 1}, headers=h)).status_code == 200


async def test_an_attempts_token_stops_working_when_the_next_attempt_starts(secured):
    c = secured.client
    job_id, old = await _job_and_token(secured)
    new = (await c.post(f"/api/v1/jobs/{job_id}/attempts", json={}, headers=bearer(ADMIN))).json()["task_token"]
    for method, path, body in (
        ("GET", f"/api/v1/jobs/{job_id}", None),
        ("POST", f"/api/v1/jobs/{job_id}/checkpoints", {}),
        ("GET", f"/api/v1/jobs/{job_id}/events/history", None),
    ):
        r = await c.request(method, path, json=body, headers=bearer(old))
        assert r.status_code == 401 and "attempt 1" in r.json()["error"]["message"], r.text
    r = await c.post(f"/api/v1/jobs/{job_id}/checkpoints", json={}, headers=bearer(new))
    assert r.status_code == 201
    ack = {"attempt": 1, "vertex": "a", "subtask_index": 0}
    r = await c.post(f"/api/v1/jobs/{job_id}/checkpoints/{r.json()['id']}/acks", json=ack, headers=bearer(old))
    assert r.status_code == 401 and "use that attempt's token" in r.json()["error"]["message"]


@pytest.mark.parametrize("end", ["cancel", "finish", "savepoint-stop"])
async def test_an_attempts_token_stops_working_when_the_job_ends(secured, end):
    c = secured.client
    job_id, token = await _job_and_token(secured)
    base = f"/api/v1/jobs/{job_id}"
    if end == "cancel":
        await c.post(f"{base}/cancel", headers=bearer(ADMIN))
    elif end == "finish":
        await c.post(f"{base}/finish", json={"status": "FINISHED"}, headers=bearer(token))
    else:
        sp = (await c.post(f"{base}/savepoints", json={"stop": True}, headers=bearer(token))).json()
        ack = {"attempt": 1, "vertex": "a", "subtask_index": 0}
        assert (await c.post(f"{base}/checkpoints/{sp['id']}/acks", json=ack, headers=bearer(token))).status_code == 200
    assert (await c.get(base, headers=bearer(ADMIN))).json()["status"] in ("CANCELLED", "FINISHED")
    r = await c.get(f"{base}/events/history", headers=bearer(token))
    assert r.status_code == 401 and "which ended" in r.json()["error"]["message"]


async def test_without_auth_a_cross_origin_form_post_cannot_cancel_a_job(sqlite_api):
    job = await sqlite_api.job()
    r = await sqlite_api.client.post(
        f"/api/v1/jobs/{job['id']}/cancel",
        headers={"Origin": "https://evil.example", "Content-Type": "application/x-www-form-urlencoded"},
        content=b"x=1",
    )
    assert r.status_code == 403 and "OVERTAKE_CORS_ORIGINS" in r.json()["error"]["message"]
    assert (await sqlite_api.client.get(f"/api/v1/jobs/{job['id']}")).json()["status"] == "RUNNING"


async def test_without_auth_a_cross_site_fetch_without_origin_is_refused(sqlite_api):
    job = await sqlite_api.job()
    r = await sqlite_api.client.post(f"/api/v1/jobs/{job['id']}/cancel", headers={"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://coordinator"},  # the same origin (the test client's host)
        {"X-Overtake-Client": "ui", "Origin": "http://proxy.example"},  # the UI behind a proxy
        {},  # not a browser: the SDK, the runtime, curl
    ],
)
async def test_without_auth_same_origin_ui_and_non_browser_requests_pass(sqlite_api, headers):
    job = await sqlite_api.job()
    r = await sqlite_api.client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=headers)
    assert r.status_code == 200, r.text


async def test_an_allowed_origin_gets_cors_headers_and_may_change_state(make_api):
    async with make_api(cors_origins=["https://ops.example"]) as api:
        job = await api.job()
        pre = await api.client.options(
            f"/api/v1/jobs/{job['id']}/cancel",
            headers={"Origin": "https://ops.example", "Access-Control-Request-Method": "POST"},
        )
        assert pre.headers["access-control-allow-origin"] == "https://ops.example"
        r = await api.client.post(f"/api/v1/jobs/{job['id']}/cancel", headers={"Origin": "https://ops.example"})
        assert r.status_code == 200
        other = await api.client.options(
            f"/api/v1/jobs/{job['id']}/cancel",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        )
        assert "access-control-allow-origin" not in other.headers


async def test_without_auth_a_cross_origin_ack_is_refused_too(sqlite_api):
    job = await sqlite_api.job()
    await sqlite_api.trigger(job["id"])
    r = await sqlite_api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/1/acks",
        json={"attempt": 1, "vertex": "src", "subtask_index": 0},
        headers={"Origin": "https://evil.example"},
    )
    assert r.status_code == 403
    assert (await sqlite_api.checkpoint(job["id"], 1))["num_acknowledged_subtasks"] == 0
