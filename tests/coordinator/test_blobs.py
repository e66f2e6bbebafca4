"""Blob uploads and downloads: verified before stored, size-limited, idempotent per slot, ranges, no path escapes."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest
from sqlalchemy import func, select

from app.db.models import BlobRow


async def _count_blobs(api) -> int:
    async with api.ctx.tx(readonly=True) as s:
        return (await s.execute(select(func.count()).select_from(BlobRow))).scalar_one()


def _stored_files(api) -> list:
    # os.walk, not rglob: a directory the store's cleaning deletes meanwhile is skipped, not a FileNotFoundError
    root = Path(api.ctx.store.root)
    return [Path(d) / f for d, _, files in os.walk(root) for f in files if ".staging" not in Path(d).parts]


async def test_upload_is_stored_and_downloaded_whole_and_by_range(api):
    job = await api.job()
    await api.trigger(job["id"])
    data = bytes(range(256)) * 40
    r = await api.upload(job["id"], 1, "agg", 0, data)
    assert r.status_code == 201
    info = r.json()
    assert info["size"] == len(data) and info["sha256"] == hashlib.sha256(data).hexdigest()
    path = f"/api/v1/jobs/{job['id']}/blobs/{info['blob_id']}"
    whole = await api.client.get(path)
    assert whole.status_code == 200 and whole.content == data
    assert whole.headers["accept-ranges"] == "bytes"
    part = await api.client.get(path, headers={"Range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == data[100:200]
    assert part.headers["content-range"] == f"bytes 100-199/{len(data)}"
    tail = await api.client.get(path, headers={"Range": "bytes=-10"})
    assert tail.content == data[-10:]
    open_end = await api.client.get(path, headers={"Range": f"bytes={len(data) - 5}-"})
    assert open_end.content == data[-5:]
    bad = await api.client.get(path, headers={"Range": f"bytes={len(data)}-"})
    assert bad.status_code == 416 and bad.json()["error"]["code"] == "range_not_satisfiable"


async def test_checksum_mismatch_is_refused_and_nothing_is_stored(api):
    job = await api.job()
    await api.trigger(job["id"])
    r = await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/1/blobs",
        params={"attempt": 1, "vertex": "agg", "subtask_index": 0, "kind": "channel"},
        content=b"the real bytes",
        headers={"X-Overtake-Sha256": hashlib.sha256(b"other bytes").hexdigest()},
    )
    assert r.status_code == 422 and "sha256" in r.json()["error"]["message"]
    assert await _count_blobs(api) == 0
    assert _stored_files(api) == []


async def test_malformed_checksum_header_is_422(api):
    job = await api.job()
    await api.trigger(job["id"])
    r = await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/1/blobs",
        params={"attempt": 1, "vertex": "agg", "subtask_index": 0, "kind": "channel"},
        content=b"x",
        headers={"X-Overtake-Sha256": "../../etc/passwd"},
    )
    assert r.status_code == 422
    assert await _count_blobs(api) == 0


async def test_upload_over_the_size_limit_is_413_and_nothing_is_stored(make_api):
    async with make_api(max_blob_size=1000) as api:
        job = await api.job()
        await api.trigger(job["id"])
        r = await api.upload(job["id"], 1, "agg", 0, b"x" * 1001)
        assert r.status_code == 413 and "1000 bytes" in r.json()["error"]["message"]

        async def chunks():  # no Content-Length: the limit is enforced while streaming
            for _ in range(20):
                yield b"y" * 100

        r = await api.client.post(
            f"/api/v1/jobs/{job['id']}/checkpoints/1/blobs",
            params={"attempt": 1, "vertex": "agg", "subtask_index": 0, "kind": "channel"},
            content=chunks(),
            headers={"X-Overtake-Sha256": hashlib.sha256(b"y" * 2000).hexdigest()},
        )
        assert r.status_code == 413
        assert await _count_blobs(api) == 0 and _stored_files(api) == []


async def test_retried_upload_returns_the_same_blob_and_a_different_one_is_409(api):
    job = await api.job()
    await api.trigger(job["id"])
    first = await api.upload(job["id"], 1, "agg", 0, b"abc")
    again = await api.upload(job["id"], 1, "agg", 0, b"abc")
    assert again.status_code == 200 and again.json()["blob_id"] == first.json()["blob_id"]
    other = await api.upload(job["id"], 1, "agg", 0, b"abd")
    assert other.status_code == 409 and "cannot be replaced" in other.json()["error"]["message"]
    assert await _count_blobs(api) == 1


async def test_the_same_upload_sent_concurrently_stores_one_blob_and_every_request_gets_it(api):
    """Identical uploads racing for one slot: one stores the blob (201), the others lose the insert and are answered
    as retries (200, the same blob), never with an error."""
    job = await api.job()
    await api.trigger(job["id"])
    data = b"the same bytes" * 100
    answers = await asyncio.gather(*(api.upload(job["id"], 1, "agg", 0, data) for _ in range(10)))
    assert sorted(r.status_code for r in answers) == [200] * 9 + [201], [r.text for r in answers]
    assert len({r.json()["blob_id"] for r in answers}) == 1
    assert await _count_blobs(api) == 1 and len(_stored_files(api)) == 1


async def test_upload_for_an_aborted_checkpoint_or_wrong_attempt_is_409(api):
    job = await api.job(tolerable_failures=5)
    await api.trigger(job["id"])
    r = await api.upload(job["id"], 1, "agg", 0, b"abc", attempt=2)
    assert r.status_code == 409 and "attempt 1" in r.json()["error"]["message"]
    await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/1/declines",
        json={"attempt": 1, "vertex": "agg", "subtask_index": 1, "reason": "no"},
    )
    r = await api.upload(job["id"], 1, "agg", 0, b"abc")
    assert r.status_code == 409 and "aborted" in r.json()["error"]["message"]
    assert await _count_blobs(api) == 0


async def test_an_upload_from_a_subtask_that_acked_already_is_409_and_stores_nothing(api):
    """Its ack is recorded and names no such blob: nothing could ever name the blob."""
    job = await api.job()
    await api.trigger(job["id"])
    assert (await api.ack(job["id"], 1, "agg", 0)).status_code == 200
    r = await api.upload(job["id"], 1, "agg", 0, b"state after the ack")
    assert r.status_code == 409 and "already sent an ack for checkpoint 1" in r.json()["error"]["message"], r.text
    assert await _count_blobs(api) == 0 and _stored_files(api) == []


async def test_aborting_a_checkpoint_deletes_its_blobs(api):
    job = await api.job(tolerable_failures=5)
    await api.trigger(job["id"])
    info = (await api.upload(job["id"], 1, "agg", 0, b"in flight")).json()
    await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/1/declines",
        json={"attempt": 1, "vertex": "agg", "subtask_index": 1, "reason": "no"},
    )
    r = await api.client.get(f"/api/v1/jobs/{job['id']}/blobs/{info['blob_id']}")
    assert r.status_code == 404
    assert _stored_files(api) == []


@pytest.mark.parametrize("blob_id", ["..%2F..%2Fetc%2Fpasswd", "0" * 31 + "g", "%2e%2e", "abc"])
async def test_blob_ids_that_are_not_issued_ids_never_touch_the_filesystem(api, blob_id):
    job = await api.job()
    r = await api.client.get(f"/api/v1/jobs/{job['id']}/blobs/{blob_id}")
    assert r.status_code in (404, 422)
    assert r.json()["error"]["code"] in ("invalid", "not_found")


async def test_upload_with_an_invalid_vertex_name_is_422(api):
    job = await api.job()
    await api.trigger(job["id"])
    r = await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/1/blobs",
        params={"attempt": 1, "vertex": "../../x", "subtask_index": 0, "kind": "channel"},
        content=b"abc",
        headers={"X-Overtake-Sha256": hashlib.sha256(b"abc").hexdigest()},
    )
    assert r.status_code == 422


async def test_an_ack_must_reference_its_own_verified_blob(api):
    job = await api.job()
    await api.trigger(job["id"])
    mine = (await api.upload(job["id"], 1, "agg", 0, b"mine")).json()
    ref = {"blob_id": mine["blob_id"], "sha256": mine["sha256"], "size": mine["size"]}
    r = await api.ack(job["id"], 1, "agg", 1, channel_state=ref)
    assert r.status_code == 422 and "not for checkpoint 1 subtask agg[1]" in r.json()["error"]["message"]
    r = await api.ack(job["id"], 1, "agg", 0, channel_state={**ref, "sha256": "0" * 64})
    assert r.status_code == 422 and "the ack says" in r.json()["error"]["message"]
    r = await api.ack(job["id"], 1, "agg", 0, channel_state={**ref, "blob_id": "f" * 32})
    assert r.status_code == 422 and "upload it" in r.json()["error"]["message"]
    seg = {
        "channel": "in:src[0]",
        "direction": "input",
        "offset": 2,
        "length": 10,
        "buffer_count": 1,
        "record_count": 1,
    }
    r = await api.ack(job["id"], 1, "agg", 0, channel_state=ref, channel_segments=[seg])
    assert r.status_code == 422 and "past the channel state's size" in r.json()["error"]["message"]
    r = await api.ack(job["id"], 1, "agg", 0, operator_state=ref)
    assert r.status_code == 422  # uploaded as channel state, not operator state
    ok = await api.ack(job["id"], 1, "agg", 0, channel_state=ref)
    assert ok.status_code == 200
    assert (await api.checkpoint(job["id"], 1))["num_acknowledged_subtasks"] == 1


async def test_channel_state_manifest_lists_each_subtasks_segments(api):
    job = await api.job()
    await api.trigger(job["id"], policy="unaligned")
    data = b"A" * 30 + b"B" * 20
    info = (await api.upload(job["id"], 1, "agg", 1, data)).json()
    segs = [
        {
            "channel": "in:src[0]->agg[1]",
            "direction": "input",
            "offset": 0,
            "length": 30,
            "buffer_count": 3,
            "record_count": 30,
        },
        {
            "channel": "in:src[1]->agg[1]",
            "direction": "input",
            "offset": 30,
            "length": 20,
            "buffer_count": 2,
            "record_count": 20,
        },
    ]
    ref = {"blob_id": info["blob_id"], "sha256": info["sha256"], "size": info["size"]}
    assert (
        await api.ack(job["id"], 1, "agg", 1, channel_state=ref, channel_segments=segs)
    ).status_code == 200
    m = (await api.client.get(f"/api/v1/jobs/{job['id']}/checkpoints/1/channel-state")).json()
    assert len(m["entries"]) == 1
    entry = m["entries"][0]
    assert (entry["vertex"], entry["subtask_index"], entry["blob_id"]) == ("agg", 1, info["blob_id"])
    assert [(s["offset"], s["length"]) for s in entry["segments"]] == [(0, 30), (30, 20)]
