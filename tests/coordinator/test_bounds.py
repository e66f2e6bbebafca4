"""Bounds everywhere: integers beyond what the database holds, oversized bodies and oversized uploads are refused
with a 4xx that names the limit, on every route, and change nothing."""

from __future__ import annotations

import hashlib

import pytest

LIMIT = 64 * 1024


@pytest.fixture
async def small(make_api):
    async with make_api(max_request_body=LIMIT, max_blob_size=LIMIT) as api:
        yield api


async def test_a_json_body_past_the_limit_is_refused_with_413_naming_the_limit_and_changes_nothing(small):
    job = await small.job()
    r = await small.client.post(
        f"/api/v1/jobs/{job['id']}/finish", json={"status": "FAILED", "message": "x" * (LIMIT + 1)}
    )
    assert r.status_code == 413 and str(LIMIT) in r.json()["error"]["message"]
    assert (await small.client.get(f"/api/v1/jobs/{job['id']}")).json()["status"] == "RUNNING"


async def test_an_external_checkpoint_with_oversized_metrics_is_refused(small):
    job = await small.job()
    body = {"id": 1, "trigger_timestamp": 1, "completed_timestamp": 2, "metrics": {"m": "x" * LIMIT}}
    r = await small.client.post(f"/api/v1/jobs/{job['id']}/checkpoints/external", json=body)
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"


async def test_the_ack_fast_path_has_the_same_body_limit(small):
    job = await small.job()
    await small.trigger(job["id"])
    body = {"attempt": 1, "vertex": "src", "subtask_index": 0, "source_offsets": {"o": "x" * LIMIT}}
    r = await small.client.post(f"/api/v1/jobs/{job['id']}/checkpoints/1/acks", json=body)
    assert r.status_code == 413 and str(LIMIT) in r.json()["error"]["message"]


async def test_a_chunked_upload_is_refused_as_soon_as_it_passes_the_limit_and_nothing_is_stored(small):
    job = await small.job()
    await small.trigger(job["id"])
    sent = {"chunks": 0}

    async def endless():
        for _ in range(100_000):  # 100 MiB if it were read in full
            sent["chunks"] += 1
            yield b"x" * 1024

    r = await small.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/1/blobs",
        params={"attempt": 1, "vertex": "src", "subtask_index": 0, "kind": "channel"},
        content=endless(),
        headers={"X-Overtake-Sha256": hashlib.sha256(b"").hexdigest(), "Content-Type": "application/octet-stream"},
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
    assert sent["chunks"] < 4 * LIMIT // 1024  # refused while arriving, not after reading it all
    assert (await small.checkpoint(job["id"], 1))["subtasks"] == []


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/jobs/9223372036854775808",
        "/api/v1/jobs/0",
        "/api/v1/jobs/1/checkpoints/9223372036854775808",
        "/api/v1/jobs/1/checkpoints?offset=9223372036854775808",
        "/api/v1/jobs/1/events/history?after=99999999999999999999",
        "/api/v1/jobs?offset=-1",
    ],
)
async def test_integers_beyond_the_columns_are_refused_with_422(sqlite_api, path):
    await sqlite_api.job()
    r = await sqlite_api.client.get(path)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid", r.text
    error = r.json()["error"]
    # said once, although the route and its auth dependency both validate the job id
    assert len(error["details"]) == 1 and ";" not in error["message"], error


@pytest.mark.parametrize("job_id", ["0", "9223372036854775808"])
async def test_the_ack_fast_path_validates_its_path_like_the_spec(sqlite_api, job_id):
    r = await sqlite_api.client.post(
        f"/api/v1/jobs/{job_id}/checkpoints/1/acks", json={"attempt": 1, "vertex": "a", "subtask_index": 0}
    )
    assert r.status_code == 422 and "job_id" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("timeout", 10**19), ("interval", 10**12), ("min_pause", 10**12), ("alignment_timeout", 3 * 10**9)],
)
async def test_config_durations_have_a_sane_maximum(sqlite_api, field, value):
    body = {"name": "j", "graph": {"vertices": [{"id": "a", "parallelism": 1}]}, "checkpoint": {field: value}}
    r = await sqlite_api.client.post("/api/v1/jobs", json=body)
    assert r.status_code == 422 and f"checkpoint.{field}" in r.json()["error"]["message"], r.text


async def test_ack_figures_beyond_the_columns_are_refused(api):
    job = await api.job()
    await api.trigger(job["id"])
    r = await api.ack(job["id"], 1, "src", 0, metrics={"processed_data": 2**63}, key_group_start=2**40)
    assert r.status_code == 422
    assert (await api.checkpoint(job["id"], 1))["num_acknowledged_subtasks"] == 0


async def test_text_postgresql_cannot_hold_is_a_422_that_changes_nothing_not_a_500(api):
    """A NUL character in free text (a failure message, a decline's or an attempt's reason): SQLite stores it,
    PostgreSQL's text cannot hold it, and its driver's refusal must be answered as the documented 422."""
    job = await api.job(tolerable_failures=5)
    jid = job["id"]
    await api.trigger(jid)
    requests = [
        (f"/api/v1/jobs/{jid}/checkpoints/1/declines",
         {"attempt": 1, "vertex": "src", "subtask_index": 0, "reason": "bad\x00byte"}),
        (f"/api/v1/jobs/{jid}/attempts", {"reason": "restart\x00"}),
        (f"/api/v1/jobs/{jid}/finish", {"status": "FAILED", "message": "boom\x00"}),
    ]
    for path, body in requests:
        before = (await api.client.get(f"/api/v1/jobs/{jid}")).json()
        r = await api.client.post(path, json=body)
        if api.backend == "postgres":
            assert r.status_code == 422, (path, r.text)
            assert r.json()["error"]["code"] == "invalid" and "0x00" in r.json()["error"]["message"], r.text
            assert (await api.client.get(f"/api/v1/jobs/{jid}")).json() == before
        else:
            assert r.status_code < 300, (path, r.text)
    if api.backend == "postgres":
        assert (await api.checkpoint(jid, 1))["status"] == "PENDING"


async def test_nan_and_infinity_in_free_form_json_are_refused_with_422_naming_where(api):
    """Source offsets and an engine's figures are kept as JSON: a NaN or an Infinity (which lenient parsers take)
    would be a 500 on PostgreSQL and silently become null on SQLite; it is a 422 that names where it is."""
    job = await api.job(tolerable_failures=5)
    jid = job["id"]
    await api.trigger(jid)
    headers = {"Content-Type": "application/json"}
    ack = b'{"attempt": 1, "vertex": "src", "subtask_index": 0, "source_offsets": {"p": [1, {"o": NaN}]}}'
    for path, body in [
        (f"/api/v1/jobs/{jid}/checkpoints/1/acks", ack),
        (f"/api/v1/jobs/{jid}/checkpoints/1/acks/batch", b'{"acks": [' + ack.replace(b"NaN", b"Infinity") + b"]}"),
    ]:
        r = await api.client.post(path, content=body, headers=headers)
        assert r.status_code == 422, (path, r.text)
        assert "source_offsets: p.1.o is not a finite number" in r.json()["error"]["message"], r.text
    assert (await api.checkpoint(jid, 1))["num_acknowledged_subtasks"] == 0
    external = await api.job()
    r = await api.client.post(
        f"/api/v1/jobs/{external['id']}/checkpoints/external",
        content=b'{"id": 1, "trigger_timestamp": 1, "completed_timestamp": 2, "metrics": {"rate": 1e400}}',
        headers=headers,
    )
    assert r.status_code == 422 and "metrics: rate is not a finite number" in r.json()["error"]["message"], r.text
    assert (await api.client.get(f"/api/v1/jobs/{external['id']}/checkpoints")).json()["total"] == 0


async def test_an_ack_whose_key_group_range_is_reversed_is_refused_and_never_reaches_a_restore_plan(api):
    job = await api.job()
    await api.trigger(job["id"])
    r = await api.ack(job["id"], 1, "agg", 0, key_group_start=7, key_group_end=2)
    assert r.status_code == 422, r.text
    assert "key_group_start 7 is after key_group_end 2" in r.json()["error"]["message"], r.text
    assert (await api.checkpoint(job["id"], 1))["num_acknowledged_subtasks"] == 0
    ok = await api.ack(job["id"], 1, "agg", 0, key_group_start=0, key_group_end=7)
    assert ok.status_code == 200, ok.text


async def test_an_ack_of_key_groups_its_vertex_does_not_have_is_refused_alone_in_its_batch(api):
    """The job's `agg` has 16 key groups (max_parallelism): state said to hold groups 100..200 could never be
    restored to a subtask; it is a 422 naming both, and the batch's other acks are recorded."""
    job = await api.job()
    await api.trigger(job["id"])
    r = await api.ack(job["id"], 1, "agg", 0, key_group_start=100, key_group_end=200)
    assert r.status_code == 422, r.text
    assert "key groups 100..200" in r.json()["error"]["message"] and "16 key groups" in r.json()["error"]["message"]
    assert (await api.checkpoint(job["id"], 1))["num_acknowledged_subtasks"] == 0
    batch = {"acks": [
        {"attempt": 1, "vertex": "agg", "subtask_index": 0, "key_group_start": 0, "key_group_end": 16},
        {"attempt": 1, "vertex": "agg", "subtask_index": 1, "key_group_start": 8, "key_group_end": 15},
    ]}
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/checkpoints/1/acks/batch", json=batch)
    assert r.status_code == 200, r.text
    assert [(i["ok"], i["status_code"]) for i in r.json()["items"]] == [(False, 422), (True, 200)]
    assert (await api.checkpoint(job["id"], 1))["num_acknowledged_subtasks"] == 1


def _stalled(url: str, method: str, path: str, content_type: str, sent: bytes, length: int,
             extra: str = "") -> tuple[int, dict]:
    """Send a request whose body stops short of its Content-Length and keep the connection open; the answer."""
    import json
    import socket
    from urllib.parse import urlparse

    where = urlparse(url)
    with socket.create_connection((where.hostname, where.port), timeout=30) as sock:
        head = (f"{method} {path} HTTP/1.1\r\nHost: coordinator\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {length}\r\n{extra}\r\n").encode()
        sock.sendall(head + sent)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _length(answer):
            chunk = sock.recv(65536)  # the socket's timeout bounds the wait: a hang fails the test
            if not chunk:
                break
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    return status, json.loads(answer.partition(b"\r\n\r\n")[2])


def _length(answer: bytes) -> int:
    for line in answer.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def test_a_body_that_stops_short_of_its_length_is_answered_408_and_changes_nothing(tmp_path):
    """A client that sends less than its Content-Length (or stalls) would hold its request open for good; after
    OVERTAKE_BODY_TIMEOUT without a byte it is answered 408, on the ack fast path, a JSON route and an upload."""
    import httpx

    from tests.live import LiveCoordinator

    with LiveCoordinator(tmp_path, {"OVERTAKE_BODY_TIMEOUT": "0.5"}) as live:
        body = {"name": "j", "graph": {"vertices": [{"id": "a", "parallelism": 1}]}}
        job = httpx.post(f"{live.url}/api/v1/jobs", json=body).raise_for_status().json()
        httpx.post(f"{live.url}/api/v1/jobs/{job['id']}/attempts", json={}).raise_for_status()
        cp = httpx.post(f"{live.url}/api/v1/jobs/{job['id']}/checkpoints", json={}).raise_for_status().json()
        stalls = [
            ("POST", f"/api/v1/jobs/{job['id']}/checkpoints/{cp['id']}/acks", "application/json", b'{"attempt": 1'),
            ("POST", "/api/v1/jobs", "application/json", b'{"name": "never"'),
            ("POST", f"/api/v1/jobs/{job['id']}/checkpoints/{cp['id']}/blobs?attempt=1&vertex=a&subtask_index=0"
             "&kind=channel", "application/octet-stream", b"x" * 10),
        ]
        sha = "X-Overtake-Sha256: " + "0" * 64 + "\r\n"  # the upload's header, checked before its body is read
        for method, path, ctype, sent in stalls:
            status, answer = _stalled(live.url, method, path, ctype, sent, 1000, sha)
            assert status == 408, (path, answer)
            assert answer["error"]["code"] == "request_timeout" and "Content-Length" in answer["error"]["message"]
        jobs = httpx.get(f"{live.url}/api/v1/jobs").json()
        assert [j["name"] for j in jobs["items"]] == ["j"]
        detail = httpx.get(f"{live.url}/api/v1/jobs/{job['id']}/checkpoints/{cp['id']}").json()
        assert detail["num_acknowledged_subtasks"] == 0 and detail["status"] == "PENDING"
