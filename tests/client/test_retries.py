"""Retry policy: which calls are repeated on which failures, and what error is left when retries run out.

These need no server: an httpx.MockTransport plays a coordinator that drops connections and answers 503.
"""

from __future__ import annotations

import hashlib
import io

import httpx
import pytest

from client import _http
from client.errors import (
    Conflict,
    CoordinatorUnreachable,
    NotFound,
    OutcomeUnknown,
    Unavailable,
    UnexpectedResponse,
)
from client.sdk import AsyncOvertakeClient, OvertakeClient
from tests.client._fakes import Script, ack_result, blob_info, checkpoint, error, record_sleeps

URL = "http://coordinator.test:8321"
ACK = {"attempt": 1, "vertex": "src", "subtask_index": 0}


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch):
    """Record the back-off delays instead of sleeping."""
    return record_sleeps(monkeypatch)


def client(script: Script, retries: int = 3) -> OvertakeClient:
    return OvertakeClient(URL, retries=retries, backoff=0.1, transport=httpx.MockTransport(script))


def test_a_get_is_retried_on_503_and_429_until_it_succeeds():
    script = Script(
        error(503, "unavailable", "db down"),
        error(429, "unavailable", "slow down"),
        httpx.Response(200, json={"status": "ok"}),
    )
    assert client(script).health() == {"status": "ok"}
    assert len(script.requests) == 3


def test_backoff_grows_exponentially_and_honours_retry_after(no_sleep):
    script = Script(
        httpx.ConnectError("refused"),
        httpx.ConnectError("refused"),
        error(503, "unavailable", "busy", headers={"Retry-After": "2"}),
        httpx.Response(200, json={}),
    )
    client(script).health()
    first, second, third = no_sleep
    assert 0.05 <= first <= 0.1
    assert 0.1 <= second <= 0.2
    assert third == 2.0


def test_connection_failures_after_all_retries_raise_unreachable_naming_the_url():
    script = Script(*[httpx.ConnectError("Connection refused")] * 4)
    with pytest.raises(CoordinatorUnreachable) as info:
        client(script, retries=3).get_job(1)
    assert URL in str(info.value)
    assert "after 4 tries" in str(info.value)
    assert len(script.requests) == 4


def test_client_errors_are_not_retried_and_carry_the_servers_message():
    script = Script(error(404, "not_found", "job 9 does not exist"))
    with pytest.raises(NotFound) as info:
        client(script).get_job(9)
    assert str(info.value) == "job 9 does not exist"
    assert (info.value.status_code, info.value.code) == (404, "not_found")
    assert len(script.requests) == 1


def test_a_trigger_is_not_retried_on_503():
    script = Script(error(503, "unavailable", "scheduler paused"))
    with pytest.raises(Unavailable, match="scheduler paused"):
        client(script).trigger_checkpoint(1)
    assert len(script.requests) == 1


def test_a_trigger_is_retried_when_the_connection_could_not_be_opened():
    script = Script(httpx.ConnectError("refused"), httpx.Response(201, json=checkpoint(4)))
    assert client(script).trigger_checkpoint(1, policy="unaligned").id == 4
    assert len(script.requests) == 2


def test_a_trigger_whose_connection_dropped_after_sending_is_reported_as_outcome_unknown():
    script = Script(httpx.ReadError("connection reset"))
    with pytest.raises(OutcomeUnknown, match="may or may not have been applied"):
        client(script).trigger_checkpoint(1)
    assert len(script.requests) == 1


@pytest.mark.parametrize("call", ["start_attempt", "trigger_savepoint", "create_job"])
def test_other_non_idempotent_calls_are_sent_once(call):
    script = Script(error(502, "http_502", "bad gateway"))
    args = {
        "start_attempt": (1,),
        "trigger_savepoint": (1,),
        "create_job": ({"name": "j", "graph": {"vertices": [{"id": "v", "parallelism": 1}]}},),
    }[call]
    with pytest.raises(Unavailable):
        getattr(client(script), call)(*args)
    assert len(script.requests) == 1


def test_an_ack_is_retried_after_a_dropped_connection_with_the_same_body():
    script = Script(
        httpx.ReadError("reset"), error(500, "internal", "boom"), httpx.Response(200, json=ack_result())
    )
    assert client(script).ack(1, 1, ACK).num_acknowledged_subtasks == 1
    assert len(script.requests) == 3
    assert script.bodies[0] == script.bodies[1] == script.bodies[2]


def test_a_conflicting_ack_raises_conflict_without_retrying():
    script = Script(error(409, "conflict", "subtask src[0] already acked checkpoint 1 with other state"))
    with pytest.raises(Conflict, match="already acked"):
        client(script).ack(1, 1, ACK)
    assert len(script.requests) == 1


@pytest.mark.parametrize(
    "make_data",
    [
        lambda payload, tmp_path: payload,
        lambda payload, tmp_path: _write(tmp_path, payload),
        lambda payload, tmp_path: str(_write(tmp_path, payload)),
        lambda payload, tmp_path: io.BytesIO(payload),
        lambda payload, tmp_path: _write(tmp_path, payload).open("rb"),
        lambda payload, tmp_path: iter([payload[:5], payload[5:]]),
    ],
    ids=["bytes", "path", "str-path", "bytesio", "file", "iterable"],
)
def test_an_upload_sends_the_sha256_and_the_whole_body_again_on_retry(make_data, tmp_path):
    payload = b"in-flight buffers " * 100_000  # several chunks
    digest = hashlib.sha256(payload).hexdigest()
    script = Script(
        httpx.WriteError("broken pipe"), httpx.Response(201, json=blob_info(digest, len(payload)))
    )
    info = client(script).upload_blob(
        1, 1, attempt=1, vertex="src", subtask_index=0, kind="channel", data=make_data(payload, tmp_path)
    )
    assert info.sha256 == digest
    assert len(script.requests) == 2
    for request, body in zip(script.requests, script.bodies, strict=True):
        assert request.headers["X-Overtake-Sha256"] == digest
        assert request.headers["Content-Length"] == str(len(payload))
        assert body == payload
    assert dict(script.requests[1].url.params) == {
        "attempt": "1",
        "vertex": "src",
        "subtask_index": "0",
        "kind": "channel",
    }


def _write(tmp_path, payload):
    path = tmp_path / "blob.bin"
    path.write_bytes(payload)
    return path


def test_a_download_sends_an_inclusive_range():
    script = Script(httpx.Response(206, content=b"cde"))
    assert client(script).download_blob(1, "b1", start=2, end=4) == b"cde"
    assert script.requests[0].headers["Range"] == "bytes=2-4"


def test_a_non_json_error_body_still_gives_a_readable_message():
    script = Script(httpx.Response(502, text="<html>bad gateway</html>"))
    with pytest.raises(Unavailable) as info:
        client(script, retries=0).get_job(1)
    assert "HTTP 502" in str(info.value) and "/api/v1/jobs/1" in str(info.value)


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, text="<html>an admin page</html>", headers={"Content-Type": "text/html"}),
        httpx.Response(200, json={"jobs": [], "count": 0}),
        httpx.Response(200, content=b""),
    ],
    ids=["html", "other-json", "empty"],
)
def test_a_success_answer_that_is_not_the_apis_raises_unexpected_response_naming_the_url(answer):
    with pytest.raises(UnexpectedResponse) as info:
        client(Script(answer), retries=0).list_jobs()
    assert info.value.status_code == 200
    assert f"the server at {URL} answered GET /api/v1/jobs with HTTP 200" in str(info.value)
    assert "is http://coordinator.test:8321 an Overtake coordinator" in str(info.value)


async def test_the_async_client_raises_unexpected_response_for_an_answer_that_is_not_the_apis():
    script = Script(httpx.Response(200, text="<html>an admin page</html>"))
    async with AsyncOvertakeClient(URL, retries=0, transport=httpx.MockTransport(script.handle_async)) as c:
        with pytest.raises(UnexpectedResponse, match="answered GET /api/v1/jobs/1 with HTTP 200"):
            await c.get_job(1)


def test_the_token_is_sent_as_a_bearer_and_with_token_replaces_it():
    script = Script(httpx.Response(200, json={}), httpx.Response(200, json={}))
    admin = OvertakeClient(URL, token="admin-secret", transport=httpx.MockTransport(script))
    admin.health()
    admin.with_token("task-secret").health()
    assert [r.headers["Authorization"] for r in script.requests] == [
        "Bearer admin-secret",
        "Bearer task-secret",
    ]


def test_url_and_token_default_to_the_environment(monkeypatch):
    monkeypatch.setenv("OVERTAKE_URL", "http://elsewhere:9000/")
    monkeypatch.setenv("OVERTAKE_TOKEN", "from-env")
    script = Script(httpx.Response(200, json={}))
    c = OvertakeClient(transport=httpx.MockTransport(script))
    c.health()
    assert str(script.requests[0].url) == "http://elsewhere:9000/healthz"
    assert script.requests[0].headers["Authorization"] == "Bearer from-env"


def test_delay_is_capped(monkeypatch):
    config = _http.ClientConfig.resolve(URL, None, 1.0, 30, 1.0)
    assert config.delay(20) <= config.max_backoff


async def test_the_async_client_retries_idempotent_calls_and_streams_uploads(monkeypatch, tmp_path):
    async def no_sleep(_):
        return None

    monkeypatch.setattr("client.aio.anyio.sleep", no_sleep)
    payload = b"x" * 3_000_000
    digest = hashlib.sha256(payload).hexdigest()
    script = Script(
        error(503, "unavailable", "busy"),
        httpx.Response(200, json=ack_result()),
        httpx.ReadError("reset"),
        httpx.Response(200, json=blob_info(digest, len(payload))),
        error(503, "unavailable", "busy"),
    )
    async with AsyncOvertakeClient(URL, retries=2, transport=httpx.MockTransport(script.handle_async)) as c:
        assert (await c.ack(1, 1, ACK)).vertex == "src"
        info = await c.upload_blob(
            1, 1, attempt=1, vertex="src", subtask_index=0, kind="operator", data=_write(tmp_path, payload)
        )
        assert info.size == len(payload)
        with pytest.raises(Unavailable):
            await c.trigger_checkpoint(1)
    assert script.bodies[2] == script.bodies[3] == payload
    assert len(script.requests) == 5
