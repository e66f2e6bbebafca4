"""Two deployments given one blob URL: job and checkpoint ids start at 1 in every database, so their prefixes would
be the same and each would delete the other's checkpoints. The first deployment claims the store; another one
refuses to start, saying what to do, and never writes into it or deletes from it; replicas of the first share it."""

from __future__ import annotations

import json

import pytest

from app.blobstore import MARKER, FileBlobStore, StoreTaken


@pytest.fixture(params=["file", "s3"])
def shared_url(request, tmp_path):
    if request.param == "s3":
        return request.getfixturevalue("s3_bucket")
    return (tmp_path / "shared-blobs").as_uri()


def _db(tmp_path, name: str) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / name}.db"


async def test_a_second_deployment_on_one_blob_url_refuses_to_start_naming_both_and_a_replica_starts(
    make_api, tmp_path, shared_url
):
    async with make_api(database_url=_db(tmp_path, "first"), blob_url=shared_url) as first:
        ctx = first.app.state.ctx
        owner = ctx.settings.effective_namespace
        marker = json.loads(await ctx.store.read_marker())
        assert marker == {"namespace": owner}

        with pytest.raises(StoreTaken) as refused:
            async with make_api(database_url=_db(tmp_path, "second"), blob_url=shared_url):
                pass
        message = str(refused.value)
        assert owner in message and "a blob URL of its own" in message and "OVERTAKE_NAMESPACE" in message
        assert json.loads(await ctx.store.read_marker()) == {"namespace": owner}  # the marker stays the first's

        # a replica (the same database) shares the store
        async with make_api(database_url=_db(tmp_path, "first"), blob_url=shared_url) as replica:
            assert replica.app.state.ctx.cleaner.owner == owner
            assert (await replica.client.get("/readyz")).status_code == 200


async def test_a_store_that_did_not_answer_at_the_start_is_claimed_before_anything_is_written_or_deleted(
    make_api, tmp_path, monkeypatch
):
    """Another deployment's store that could not be asked at this one's start: a trigger that would hand out a write
    target into it is a 503 naming both, with nothing recorded, and its cleaning deletes nothing of it."""
    url = (tmp_path / "shared-blobs").as_uri()
    async with make_api(database_url=_db(tmp_path, "first"), blob_url=url) as first:
        other = first.app.state.ctx.settings.effective_namespace

    calls = {"n": 0}
    real = FileBlobStore.read_marker

    async def unreachable_once(self):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("the store did not answer")
        return await real(self)

    monkeypatch.setattr(FileBlobStore, "read_marker", unreachable_once)
    async with make_api(database_url=_db(tmp_path, "second"), blob_url=url) as second:
        assert calls["n"] == 1  # asked at the start, and started anyway
        c = second.client
        body = {"name": "j", "graph": {"vertices": [{"id": "a", "parallelism": 1}]}}
        job = (await c.post("/api/v1/jobs", json=body)).json()["id"]
        assert (await c.post(f"/api/v1/jobs/{job}/attempts", json={})).status_code == 201
        r = await c.post(f"/api/v1/jobs/{job}/checkpoints", json={})
        assert r.status_code == 503, r.text
        assert other in r.json()["error"]["message"]
        assert (await c.get(f"/api/v1/jobs/{job}/checkpoints")).json()["items"] == []

        # the first deployment's object under the same prefix is not the second's to delete
        theirs = tmp_path / "shared-blobs" / "job-1" / "cp-000000000001" / "a-0.state"
        theirs.parent.mkdir(parents=True, exist_ok=True)
        theirs.write_bytes(b"the first deployment's state")
        with pytest.raises(StoreTaken):
            await second.app.state.ctx.cleaner.ensure_claimed()
        assert theirs.read_bytes() == b"the first deployment's state"
        assert json.loads((tmp_path / "shared-blobs" / MARKER).read_text()) == {"namespace": other}


async def test_the_embedded_default_store_is_not_claimed(make_api):
    async with make_api() as api:
        ctx = api.app.state.ctx
        assert ctx.cleaner.owner is None
        assert await ctx.store.read_marker() is None
