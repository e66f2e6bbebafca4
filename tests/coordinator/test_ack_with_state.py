"""The combined route: a subtask's blobs and its ack in one multipart request. Verified and stored before the ack,
idempotent on retries, all or nothing on bad input, and the same checkpoint as separate uploads + ack."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import struct

import pytest

from tests.coordinator.test_blobs import _count_blobs, _stored_files


def digest(data: bytes) -> dict:
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def segment(length: int) -> dict:
    return {"channel": "in:src[0]", "direction": "input", "offset": 0, "length": length, "buffer_count": 1,
            "record_count": 3}


async def report(api, job_id: int, cp: int, vertex: str, index: int, operator: bytes | None = None,
                 channel: bytes | None = None, attempt: int = 1, files: dict | None = None, **extra):
    body = {"attempt": attempt, "vertex": vertex, "subtask_index": index, **extra}
    if operator is not None:
        body.setdefault("operator_state", digest(operator))
    if channel is not None:
        body.setdefault("channel_state", digest(channel))
        body.setdefault("channel_segments", [segment(len(channel))])
    if files is None:
        files = {}
        if operator is not None:
            files["operator_state"] = ("operator", operator, "application/octet-stream")
        if channel is not None:
            files["channel_state"] = ("channel", channel, "application/octet-stream")
    url = f"/api/v1/jobs/{job_id}/checkpoints/{cp}/acks/with-state"
    if files:
        return await api.client.post(url, data={"ack": json.dumps(body)}, files=files)
    return await api.client.post(  # httpx sends a form without files url-encoded: write the multipart body
        url, content=_only_ack(body), headers={"Content-Type": "multipart/form-data; boundary=x"}
    )


def _only_ack(body: dict) -> bytes:
    return (b'--x\r\nContent-Disposition: form-data; name="ack"\r\n\r\n' + json.dumps(body).encode()
            + b"\r\n--x--\r\n")


async def test_one_request_stores_both_blobs_and_acks_and_they_restore(api):
    job = await api.job()
    await api.trigger(job["id"])
    op, ch = b"operator state", bytes(range(256)) * 8
    r = await report(api, job["id"], 1, "agg", 0, operator=op, channel=ch)
    assert r.status_code == 200, r.text
    assert r.json()["num_acknowledged_subtasks"] == 1 and r.json()["duplicate"] is False
    manifest = (await api.client.get(f"/api/v1/jobs/{job['id']}/checkpoints/1/channel-state")).json()
    (entry,) = manifest["entries"]
    stored = await api.client.get(f"/api/v1/jobs/{job['id']}/blobs/{entry['blob_id']}")
    assert stored.content == ch
    for v, i in [("src", 0), ("src", 1), ("agg", 1)]:
        assert (await report(api, job["id"], 1, v, i, operator=b"x")).status_code == 200
    assert (await api.checkpoint(job["id"], 1))["status"] == "COMPLETED"
    plan = (await api.client.get(f"/api/v1/jobs/{job['id']}/restore-plan")).json()
    agg0 = next(s for s in plan["subtasks"] if s["vertex"] == "agg" and s["subtask_index"] == 0)
    assert [seg["blob_id"] for seg in agg0["input_channel_state"]] == [entry["blob_id"]]
    assert await _count_blobs(api) == 5


async def test_a_retried_report_stores_nothing_twice_and_a_different_one_is_409(api):
    job = await api.job()
    await api.trigger(job["id"])
    first = await report(api, job["id"], 1, "agg", 0, operator=b"op", channel=b"channel bytes")
    again = await report(api, job["id"], 1, "agg", 0, operator=b"op", channel=b"channel bytes")
    assert first.status_code == again.status_code == 200
    assert again.json()["duplicate"] is True
    assert await _count_blobs(api) == 2 and len(_stored_files(api)) == 2
    other = await report(api, job["id"], 1, "agg", 0, operator=b"op", channel=b"other bytes!!")
    assert other.status_code == 409 and "cannot be replaced" in other.json()["error"]["message"]
    assert await _count_blobs(api) == 2 and len(_stored_files(api)) == 2


async def test_bad_reports_are_4xx_that_say_what_is_wrong_and_store_nothing(api):
    job = await api.job()
    await api.trigger(job["id"])
    op = b"operator state"
    cases = [
        # a part whose bytes do not match the report's sha256
        (dict(operator=op, operator_state={"sha256": "0" * 64, "size": len(op)}), 422,
         "but the report's operator_state.sha256 says 0000"),
        # sizes that disagree
        (dict(operator=op, operator_state={"sha256": digest(op)["sha256"], "size": 3}), 422, "declares 3"),
        # a declared blob that was not sent
        (dict(operator_state=digest(op)), 422, "no operator_state file part"),
        # a part the report does not declare
        (dict(files={"operator_state": ("o", op, "application/octet-stream")}), 422, "does not declare"),
        # segments past the channel blob
        (dict(channel=b"abc", channel_segments=[segment(10)]), 422, "past the channel state's size"),
        # an unknown vertex, a subtask out of range
        (dict(operator=op, vertex_override="nope"), 404, "no vertex 'nope'"),
        (dict(operator=op, index_override=9), 404, "no subtask agg[9]"),
        # another attempt's report
        (dict(operator=op, attempt=2), 409, "attempt"),
    ]
    for kwargs, status, text in cases:
        vertex = kwargs.pop("vertex_override", "agg")
        index = kwargs.pop("index_override", 0)
        r = await report(api, job["id"], 1, vertex, index, **kwargs)
        assert r.status_code == status, (kwargs, r.text)
        assert text in r.json()["error"]["message"], (text, r.json())
    missing = await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/1/acks/with-state", files={"operator_state": ("o", op)}
    )
    assert missing.status_code == 422 and "'ack' field" in missing.json()["error"]["message"]
    not_multipart = await api.client.post(f"/api/v1/jobs/{job['id']}/checkpoints/1/acks/with-state", json={})
    assert not_multipart.status_code == 422 and "multipart/form-data" in not_multipart.json()["error"]["message"]
    assert await _count_blobs(api) == 0 and _stored_files(api) == []
    assert (await api.checkpoint(job["id"], 1))["num_acknowledged_subtasks"] == 0



async def test_a_report_whose_ack_is_refused_stores_nothing_and_the_corrected_one_is_taken(api):
    """Its blobs are stored before its ack is committed; when the committer refuses the ack, the blobs go again, so
    the subtask may send other state for the checkpoint (the slot is free), and nothing lingers."""
    job = await api.job()
    await api.trigger(job["id"])
    refused = await report(api, job["id"], 1, "agg", 0, operator=b"op", channel=b"channel bytes",
                           key_group_start=0, key_group_end=40)
    assert refused.status_code == 422 and "16 key groups" in refused.json()["error"]["message"], refused.text
    assert await _count_blobs(api) == 0 and _stored_files(api) == []
    corrected = await report(api, job["id"], 1, "agg", 0, operator=b"other op", channel=b"other channel",
                             key_group_start=0, key_group_end=7)
    assert corrected.status_code == 200, corrected.text
    assert await _count_blobs(api) == 2 and len(_stored_files(api)) == 2


async def test_a_report_from_a_subtask_that_acked_already_is_409_and_stores_nothing(api):
    job = await api.job()
    await api.trigger(job["id"])
    assert (await api.ack(job["id"], 1, "agg", 0)).status_code == 200
    late = await report(api, job["id"], 1, "agg", 0, operator=b"state after the ack")
    assert late.status_code == 409 and "already sent an ack" in late.json()["error"]["message"], late.text
    assert await _count_blobs(api) == 0 and _stored_files(api) == []
    assert (await api.checkpoint(job["id"], 1))["num_acknowledged_subtasks"] == 1


async def test_a_multipart_boundary_the_parser_cannot_take_is_422_not_500(api):
    job = await api.job()
    await api.trigger(job["id"])
    boundary = "b" * 300  # RFC 2046 allows 70 characters; the parser takes 256
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="ack"\r\n\r\n'
        + json.dumps({"attempt": 1, "vertex": "agg", "subtask_index": 0})
        + f"\r\n--{boundary}--\r\n"
    ).encode()
    r = await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/1/acks/with-state",
        content=body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "invalid" and "boundary" in r.json()["error"]["message"]
    assert (await api.checkpoint(job["id"], 1))["num_acknowledged_subtasks"] == 0

async def test_a_report_without_blobs_is_a_plain_ack(api):
    job = await api.job()
    await api.trigger(job["id"])
    r = await report(api, job["id"], 1, "src", 0, source_offsets={"offset": 7})
    assert r.status_code == 200, r.text
    assert (await api.checkpoint(job["id"], 1))["num_acknowledged_subtasks"] == 1


async def test_a_report_after_the_checkpoint_was_aborted_is_409_and_stores_nothing(api):
    job = await api.job()
    await api.trigger(job["id"])
    r = await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/1/declines",
        json={"attempt": 1, "vertex": "src", "subtask_index": 0, "reason": "disk full"},
    )
    assert r.status_code == 200, r.text
    late = await report(api, job["id"], 1, "agg", 0, operator=b"late")
    assert late.status_code == 409 and "aborted" in late.json()["error"]["message"]
    assert await _count_blobs(api) == 0 and _stored_files(api) == []


@pytest.mark.parametrize(
    "body",
    [b"not multipart at all", b"--b\r\nContent-Disposition: form-data; name=\"ack\"\r\n\r\n{}"],
)
async def test_a_malformed_multipart_body_is_422_invalid_not_an_http_error(api, body):
    job = await api.job()
    await api.trigger(job["id"])
    r = await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/1/acks/with-state",
        content=body,
        headers={"Content-Type": "multipart/form-data; boundary=b"},
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid", r.text
    assert await _count_blobs(api) == 0


async def test_a_blob_part_is_refused_as_soon_as_it_passes_the_blob_limit(make_api):
    async with make_api(max_blob_size=4096) as api:
        job = await api.job()
        await api.trigger(job["id"])
        sent = {"chunks": 0}
        report_json = json.dumps(
            {"attempt": 1, "vertex": "agg", "subtask_index": 0, "operator_state": {"sha256": "0" * 64, "size": 10**9}}
        ).encode()

        async def body():
            yield b"--b\r\nContent-Disposition: form-data; name=\"ack\"\r\nContent-Type: application/json\r\n\r\n"
            yield report_json
            yield b"\r\n--b\r\nContent-Disposition: form-data; name=\"operator_state\"; filename=\"o\"\r\n\r\n"
            for _ in range(10_000):
                sent["chunks"] += 1
                yield b"x" * 1024

        r = await api.client.post(
            f"/api/v1/jobs/{job['id']}/checkpoints/1/acks/with-state",
            content=body(),
            headers={"Content-Type": "multipart/form-data; boundary=b"},
        )
        assert r.status_code == 413 and "4096" in r.json()["error"]["message"]
        assert sent["chunks"] < 100
        assert await _count_blobs(api) == 0


async def test_the_same_report_sent_concurrently_records_one_ack_and_answers_the_rest_as_duplicates(api):
    job = await api.job()
    await api.trigger(job["id"])
    op, ch = b"operator state", bytes(range(256)) * 8
    answers = await asyncio.gather(
        *(report(api, job["id"], 1, "agg", 0, operator=op, channel=ch) for _ in range(10))
    )
    assert [r.status_code for r in answers] == [200] * 10, [r.text for r in answers]
    assert sorted(r.json()["duplicate"] for r in answers) == [False] + [True] * 9
    assert await _count_blobs(api) == 2 and len(_stored_files(api)) == 2
    assert (await api.checkpoint(job["id"], 1))["num_acknowledged_subtasks"] == 1


async def test_a_subtask_that_disconnects_in_the_middle_of_its_report_is_no_error_and_stores_nothing(api, caplog):
    """A subtask killed while it sends its state: the request ends there, nothing is stored and the coordinator
    logs no error with a traceback (an executor dying is an everyday event)."""
    job = await api.job()
    await api.trigger(job["id"])
    op = b"operator state" * 1000
    ack = {"attempt": 1, "vertex": "agg", "subtask_index": 0, "operator_state": digest(op)}
    body = (
        b'--x\r\nContent-Disposition: form-data; name="ack"\r\n\r\n' + json.dumps(ack).encode()
        + b'\r\n--x\r\nContent-Disposition: form-data; name="operator_state"; filename="o"\r\n\r\n' + op
        + b"\r\n--x--\r\n"
    )
    path = f"/api/v1/jobs/{job['id']}/checkpoints/1/acks/with-state"
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
        "headers": [(b"host", b"coordinator"), (b"content-type", b"multipart/form-data; boundary=x"),
                    (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 40000), "server": ("coordinator", 80), "state": {},
    }
    messages = [{"type": "http.request", "body": body[: len(body) // 2], "more_body": True}]

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    with caplog.at_level(logging.INFO):
        await api.app(scope, receive, send)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert sent[0]["status"] == 400
    assert await _count_blobs(api) == 0 and _stored_files(api) == []
    assert (await api.checkpoint(job["id"], 1))["num_acknowledged_subtasks"] == 0


async def test_a_segment_preview_reads_only_its_subtasks_ack(api):
    """The preview of one segment read the checkpoint's whole channel-state manifest (every ack's segments: thousands
    in a big job) to find one entry; it reads that subtask's ack alone."""
    from sqlalchemy import event

    from app.db.models import AckRow
    from tests.ui.seed import frame

    job = await api.job(parallelism={"src": 2, "agg": 6})
    await api.trigger(job["id"])
    channel = struct.pack("<I", len(buffer := frame([("k", 1), ("k", 2), ("k", 3)]))) + buffer
    for i in range(6):
        assert (await report(api, job["id"], 1, "agg", i, channel=channel)).status_code == 200
    loaded = []

    def load(target, context):
        loaded.append((target.vertex, target.subtask_index))

    params = {"vertex": "agg", "subtask_index": 4, "channel": "in:src[0]", "direction": "input"}
    event.listen(AckRow, "load", load)
    try:
        r = await api.client.get(f"/api/v1/jobs/{job['id']}/checkpoints/1/channel-state/preview", params=params)
        missing = await api.client.get(
            f"/api/v1/jobs/{job['id']}/checkpoints/1/channel-state/preview", params={**params, "vertex": "src", "subtask_index": 1}
        )
    finally:
        event.remove(AckRow, "load", load)
    assert r.status_code == 200, r.text
    assert [rec["text"] for rec in r.json()["records"]] == ["('k', 1)", "('k', 2)", "('k', 3)"]
    assert missing.status_code == 404 and "no channel state of src[1]" in missing.json()["error"]["message"]
    assert loaded == [("agg", 4)]
