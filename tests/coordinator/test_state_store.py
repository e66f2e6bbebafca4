"""State straight into the blob store, on a shared directory (file://) and on an S3 server speaking the real HTTP
protocol (s3://, moto's server through s3fs): write targets scoped to a checkpoint's prefix, acks counted only for
objects that exist with their size, cleanup by prefix, restore plans that read the store directly, corrupt blobs."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import subprocess
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from urllib.parse import urlparse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from sqlalchemy import func, select

from app.blobstore import MARKER, FileBlobStore, S3BlobStore, checkpoint_prefix
from app.db.models import AckRow, BlobRow, CheckpointRow
from app.errors import Invalid
from app.settings import Settings
from contract.models import STATE_KEY_PATTERN
from tests.coordinator._state import read_location, target_of, write_object, written

JOB_VERTICES = (("src", 2), ("agg", 2))


def policy_of(target: dict) -> dict:
    return json.loads(base64.b64decode(target["fields"]["policy"]))


async def stored_keys(api) -> set[str]:
    """Every object in the store, by key (relative to the store's root)."""
    store = api.ctx.store
    if isinstance(store, FileBlobStore):
        # os.walk, not rglob: the store's cleaning deletes directories in the background while this lists them, and
        # a directory gone between its listing and its scan is skipped (rglob raises FileNotFoundError)
        root = Path(store.root)
        return {
            (Path(d) / f).relative_to(root).as_posix()
            for d, _, files in os.walk(root)
            for f in files
            if ".staging" not in Path(d).relative_to(root).parts
        }
    found = await asyncio.to_thread(store.fs.find, store.root)
    return {p[len(store.root) + 1 :] for p in found}


async def under(api, prefix: str) -> set[str]:
    return {k for k in await stored_keys(api) if k.startswith(prefix)}


async def rows(api, model, **where) -> int:
    async with api.ctx.tx(readonly=True) as s:
        q = select(func.count()).select_from(model)
        for column, value in where.items():
            q = q.where(getattr(model, column) == value)
        return (await s.execute(q)).scalar_one()


def _segments(out: bytes, inp: bytes, i: int) -> list[dict]:
    return [
        {
            "channel": f"out:agg[{i}]->sink",
            "direction": "output",
            "offset": 0,
            "length": len(out),
            "buffer_count": 1,
            "record_count": 1,
        },
        {
            "channel": f"in:src[0]->agg[{i}]",
            "direction": "input",
            "offset": len(out),
            "length": len(inp),
            "buffer_count": 1,
            "record_count": 1,
            "partitioning": "hash",
        },
    ]


async def complete_written(api, job: dict, tag: str, *, savepoint: bool = False, attempt: int = 1):
    """Take a checkpoint whose subtasks all write their state into the store and ack it; returns (checkpoint id,
    {(vertex, index): (key, operator bytes, output bytes, input bytes)})."""
    if savepoint:
        cp = (await api.client.post(f"/api/v1/jobs/{job['id']}/savepoints", json={})).json()["id"]
    else:
        r = await api.trigger(job["id"])
        assert r.status_code == 201, r.text
        cp = r.json()["id"]
    target = await target_of(api, job["id"], cp)
    state = {}
    for v, p in JOB_VERTICES:
        for i in range(p):
            op = f"{tag}:{v}[{i}] operator state".encode()
            out, inp = (f"{tag}:{v}[{i}] out".encode(), f"{tag}:{v}[{i}] in".encode()) if v == "agg" else (b"", b"")
            key = await write_object(target, f"{v}-{i}-a{attempt}.state", op + out + inp)
            extra = {"written": written(key, op, out + inp)}
            if v == "agg":
                extra["channel_segments"] = _segments(out, inp, i)
                extra["key_group_start"], extra["key_group_end"] = (0, 7) if i == 0 else (8, 15)
            else:
                extra["source_offsets"] = {"partition": cp * 10 + i}
            r = await api.ack(job["id"], cp, v, i, attempt, **extra)
            assert r.status_code == 200, r.text
            state[(v, i)] = (key, op, out, inp)
    return cp, state


# --------------------------------------------------------------------------- write targets


async def test_the_store_is_ready(store_api):
    r = await store_api.client.get("/readyz")
    assert r.status_code == 200 and r.json()["checks"]["blob_store"] == "ok", r.text


async def test_every_trigger_event_carries_a_write_target_scoped_to_its_checkpoints_prefix(store_api):
    api = store_api
    job = await api.job(max_concurrent=5)
    manual = (await api.trigger(job["id"])).json()["id"]
    savepoint = (await api.client.post(f"/api/v1/jobs/{job['id']}/savepoints", json={})).json()["id"]
    events = {e["data"]["checkpoint_id"]: e["data"] for e in await api.events(job["id"])
              if e["type"] == "checkpoint.triggered"}
    for cp in (manual, savepoint):
        data = events[cp]
        target = data["target"]
        prefix = f"job-{job['id']}/cp-{cp:012d}/"
        assert target["prefix"] == prefix == checkpoint_prefix(job["id"], cp)
        assert target["expires_at"] == data["timeout_at"]
        store = api.ctx.store
        if isinstance(store, FileBlobStore):
            assert target["url"] == store.root.as_uri() + "/" and target["fields"] == {}
        else:
            assert target["fields"]["key"] == f"overtake/{prefix}${{filename}}"
            conditions = policy_of(target)["conditions"]
            starts = [c for c in conditions if isinstance(c, list) and c[0] == "starts-with"]
            assert starts and all(c == ["starts-with", "$key", f"overtake/{prefix}"] for c in starts)
            assert ["content-length-range", 0, api.ctx.settings.max_blob_size] in conditions
            assert {"bucket": store.bucket} in conditions
            expiration = datetime.fromisoformat(policy_of(target)["expiration"].replace("Z", "+00:00")).timestamp()
            # the grant ends with the checkpoint's timeout: never before it, and not long after it
            assert data["timeout_at"] / 1000 - 1 <= expiration <= data["timeout_at"] / 1000 + 60


async def test_periodic_triggers_carry_a_write_target_too(sqlite_api):
    api = sqlite_api
    job = await api.job(interval=50)

    async def triggered():
        found = [e for e in await api.events(job["id"]) if e["type"] == "checkpoint.triggered"]
        return found[0] if found else None

    event = await api.wait_for(triggered, what="a periodic checkpoint")
    assert event["data"]["target"]["prefix"] == checkpoint_prefix(job["id"], event["data"]["checkpoint_id"])


async def test_a_presigned_post_writes_under_its_prefix_and_the_ack_counts_it(store_api):
    api = store_api
    job = await api.job()
    await api.trigger(job["id"])
    target = await target_of(api, job["id"], 1)
    key = await write_object(target, "agg-0-a1.state", b"operator" + b"channel")
    assert key in await under(api, target["prefix"])
    r = await api.ack(job["id"], 1, "agg", 0, written=written(key, b"operator", b"channel"))
    assert r.status_code == 200, r.text
    assert r.json()["num_acknowledged_subtasks"] == 1 and r.json()["duplicate"] is False
    async with api.ctx.tx(readonly=True) as s:
        parts = {
            b.kind: (b.key, b.offset, b.size)
            for b in (await s.execute(select(BlobRow).where(BlobRow.job_id == job["id"]))).scalars()
        }
    assert parts == {"operator": (key, 0, 8), "channel": (key, 8, 7)}
    assert (await api.checkpoint(job["id"], 1))["state_size"] == 15


# --------------------------------------------------------------------------- acks with written state


@pytest.mark.parametrize(
    "write, says, phrase",
    [
        (None, 12, "does not exist"),
        (b"short", 12, "has 5 bytes in the blob store but the ack says 12"),
        (b"much too long state", 12, "has 19 bytes"),
    ],
    ids=["missing", "short", "long"],
)
async def test_an_ack_is_counted_only_when_its_object_exists_with_its_size(store_api, write, says, phrase):
    api = store_api
    job = await api.job()
    await api.trigger(job["id"])
    target = await target_of(api, job["id"], 1)
    key = target["prefix"] + "agg-0-a1.state"
    if write is not None:
        await write_object(target, "agg-0-a1.state", write)
    body = {"key": key, "size": says, "operator_size": says, "operator_sha256": "a" * 64}
    r = await api.ack(job["id"], 1, "agg", 0, written=body)
    assert r.status_code == 422, r.text
    assert key in r.json()["error"]["message"] and phrase in r.json()["error"]["message"]
    assert (await api.checkpoint(job["id"], 1))["num_acknowledged_subtasks"] == 0
    assert await rows(api, AckRow, job_id=job["id"]) == 0 and await rows(api, BlobRow, job_id=job["id"]) == 0
    # once written whole, the same subtask's ack is counted
    await write_object(target, "agg-0-a1.state", b"x" * says)
    assert (await api.ack(job["id"], 1, "agg", 0, written=body)).status_code == 200


async def test_an_ack_naming_another_subtasks_object_is_409_and_records_nothing(store_api):
    """Each subtask acks the object it wrote: a restore would hand the other subtask's state to it otherwise. So
    too for two acks of one batch."""
    api = store_api
    job = await api.job()
    await api.trigger(job["id"])
    target = await target_of(api, job["id"], 1)
    theirs = await write_object(target, "agg-1-a1.state", b"agg[1]'s state")
    assert (await api.ack(job["id"], 1, "agg", 1, written=written(theirs, b"agg[1]'s state", b""))).status_code == 200
    r = await api.ack(job["id"], 1, "agg", 0, written=written(theirs, b"agg[1]'s state", b""))
    assert r.status_code == 409, r.text
    assert theirs in r.json()["error"]["message"] and "subtask agg[1] acked" in r.json()["error"]["message"]
    assert await rows(api, AckRow, job_id=job["id"], vertex="agg", subtask_index=0) == 0
    shared = await write_object(target, "src-0-a1.state", b"src state")
    acks = [{"attempt": 1, "vertex": "src", "subtask_index": i, "written": written(shared, b"src state", b"")}
            for i in (0, 1)]
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/checkpoints/1/acks/batch", json={"acks": acks})
    assert [item["status_code"] for item in r.json()["items"]] == [200, 409], r.text
    assert await rows(api, BlobRow, job_id=job["id"], key=shared) == 1
    assert (await api.checkpoint(job["id"], 1))["num_acknowledged_subtasks"] == 2


async def test_an_ack_whose_segments_claim_the_same_bytes_twice_is_422_and_records_nothing(store_api):
    """A restore would replay those bytes on both channels: records twice, or on a channel they never travelled."""
    api = store_api
    job = await api.job()
    await api.trigger(job["id"])
    target = await target_of(api, job["id"], 1)
    key = await write_object(target, "agg-0-a1.state", b"op" + b"outin")
    segments = _segments(b"out", b"in", 0)
    segments[1]["offset"] = 2  # the input segment starts inside the output segment's bytes
    r = await api.ack(job["id"], 1, "agg", 0, written=written(key, b"op", b"outin"), channel_segments=segments)
    assert r.status_code == 422, r.text
    assert "both hold bytes 2..2" in r.json()["error"]["message"]
    assert await rows(api, AckRow, job_id=job["id"]) == 0 and await rows(api, BlobRow, job_id=job["id"]) == 0


async def test_the_same_written_ack_again_is_a_duplicate_and_a_different_one_is_409(store_api):
    api = store_api
    job = await api.job()
    await api.trigger(job["id"])
    target = await target_of(api, job["id"], 1)
    key = await write_object(target, "agg-0-a1.state", b"opchannel")
    first = await api.ack(job["id"], 1, "agg", 0, written=written(key, b"op", b"channel"))
    again = await api.ack(job["id"], 1, "agg", 0, written=written(key, b"op", b"channel"))
    assert first.status_code == again.status_code == 200 and again.json()["duplicate"] is True
    other = await api.ack(job["id"], 1, "agg", 0, written=written(key, b"opc", b"hannel"))
    assert other.status_code == 409 and "different content" in other.json()["error"]["message"]
    assert await rows(api, BlobRow, job_id=job["id"]) == 2


async def test_a_retried_ack_stays_a_duplicate_after_its_checkpoint_aborted_and_its_objects_went(store_api):
    api = store_api
    job = await api.job(tolerable_failures=5)
    await api.trigger(job["id"])
    target = await target_of(api, job["id"], 1)
    key = await write_object(target, "agg-0-a1.state", b"state")
    ack = written(key, b"state", b"")
    assert (await api.ack(job["id"], 1, "agg", 0, written=ack)).status_code == 200
    await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/1/declines",
        json={"attempt": 1, "vertex": "agg", "subtask_index": 1, "reason": "no"},
    )
    assert await under(api, target["prefix"]) == set()
    again = await api.ack(job["id"], 1, "agg", 0, written=ack)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    late = await api.ack(job["id"], 1, "src", 0, written=written(target["prefix"] + "src-0-a1.state", b"s", b""))
    assert late.status_code == 409 and "aborted" in late.json()["error"]["message"]


@pytest.mark.parametrize(
    "key, status, phrase",
    [
        ("job-{job}/cp-000000000002/agg-0-a1.state", 422, "not under checkpoint 1's prefix"),
        ("job-{other}/cp-000000000001/agg-0-a1.state", 403, "not under job {job}'s prefix"),
        ("job-{job}1/cp-000000000001/agg-0-a1.state", 403, "not under job {job}'s prefix"),
        ("job-{job}/cp-000000000001/..", 422, "key"),
        ("job-{job}/cp-000000000001/.hidden", 422, "key"),
        ("job-{job}/cp-000000000001/a/b.state", 422, "key"),
        ("../job-{job}/cp-000000000001/x", 422, "key"),
        ("/etc/passwd", 422, "key"),
    ],
)
async def test_a_key_outside_the_checkpoints_prefix_of_its_own_job_is_refused(store_api, key, status, phrase):
    api = store_api
    job = await api.job()
    other = await api.job()
    await api.trigger(other["id"])
    await api.trigger(job["id"])
    # the other job's object exists: still refused (and not even looked up)
    other_key = await write_object(await target_of(api, other["id"], 1), "agg-0-a1.state", b"theirs")
    key = key.format(job=job["id"], other=other["id"])
    r = await api.ack(job["id"], 1, "agg", 0, written={"key": key, "size": 6, "operator_size": 6,
                                                       "operator_sha256": "b" * 64})
    assert r.status_code == status, r.text
    assert phrase.format(job=job["id"]) in r.json()["error"]["message"]
    assert await rows(api, AckRow, job_id=job["id"]) == 0 and await rows(api, BlobRow) == 0
    assert other_key in await stored_keys(api)


async def test_a_batch_answers_each_written_ack_on_its_own(store_api):
    api = store_api
    job = await api.job()
    other = await api.job()
    await api.trigger(job["id"])
    target = await target_of(api, job["id"], 1)
    ok = await write_object(target, "agg-0-a1.state", b"fine")
    acks = [
        {"attempt": 1, "vertex": "agg", "subtask_index": 0, "written": written(ok, b"fine", b"")},
        {"attempt": 1, "vertex": "agg", "subtask_index": 1,
         "written": written(target["prefix"] + "agg-1-a1.state", b"never written", b"")},
        {"attempt": 1, "vertex": "src", "subtask_index": 0,
         "written": written(f"job-{other['id']}/cp-000000000001/x.state", b"x", b"")},
        {"attempt": 1, "vertex": "src", "subtask_index": 1},
    ]
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/checkpoints/1/acks/batch", json={"acks": acks})
    assert r.status_code == 200, r.text
    assert [item["status_code"] for item in r.json()["items"]] == [200, 422, 403, 200]
    assert (await api.checkpoint(job["id"], 1))["num_acknowledged_subtasks"] == 2


async def test_state_uploaded_through_the_coordinator_cannot_also_be_acked_as_written(store_api):
    api = store_api
    job = await api.job()
    await api.trigger(job["id"])
    assert (await api.upload(job["id"], 1, "agg", 0, b"uploaded", kind="operator")).status_code == 201
    target = await target_of(api, job["id"], 1)
    key = await write_object(target, "agg-0-a1.state", b"written")
    r = await api.ack(job["id"], 1, "agg", 0, written=written(key, b"written", b""))
    assert r.status_code == 409 and "uploaded state" in r.json()["error"]["message"]
    assert (await api.checkpoint(job["id"], 1))["num_acknowledged_subtasks"] == 0


async def test_uploads_through_the_coordinator_lie_under_their_checkpoints_prefix(store_api):
    api = store_api
    job = await api.job()
    await api.trigger(job["id"])
    info = (await api.upload(job["id"], 1, "agg", 0, b"uploaded")).json()
    assert await under(api, f"job-{job['id']}/") == {f"job-{job['id']}/cp-000000000001/{info['blob_id']}"}


# --------------------------------------------------------------------------- layout and cleanup


async def test_an_abort_deletes_its_checkpoints_prefix_and_nothing_else(store_api):
    api = store_api
    job = await api.job(max_concurrent=2, tolerable_failures=5)
    other = await api.job()
    await api.trigger(job["id"])
    await api.trigger(job["id"])
    await api.trigger(other["id"])
    mine1, mine2, theirs = [await target_of(api, j, 1) for j in (job["id"],)] + [
        await target_of(api, job["id"], 2), await target_of(api, other["id"], 1)
    ]
    k1 = await write_object(mine1, "agg-0-a1.state", b"one")
    assert (await api.ack(job["id"], 1, "agg", 0, written=written(k1, b"one", b""))).status_code == 200
    await write_object(mine1, "agg-1-a1.state", b"unacked")  # a subtask that has not acked yet
    k2 = await write_object(mine2, "agg-0-a1.state", b"two")
    k3 = await write_object(theirs, "agg-0-a1.state", b"theirs")
    upload = (await api.upload(job["id"], 1, "src", 0, b"uploaded")).json()
    r = await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/1/declines",
        json={"attempt": 1, "vertex": "src", "subtask_index": 1, "reason": "disk full"},
    )
    assert r.status_code == 200 and r.json()["status"] == "ABORTED"
    assert await under(api, mine1["prefix"]) == set()
    assert {k2, k3} <= await stored_keys(api)
    assert await rows(api, BlobRow, job_id=job["id"], checkpoint_id=1) == 0
    gone = await api.client.get(f"/api/v1/jobs/{job['id']}/blobs/{upload['blob_id']}")
    assert gone.status_code == 404


async def test_a_new_attempt_deletes_the_prefixes_of_the_old_attempts_pending_checkpoints(store_api):
    api = store_api
    job = await api.job()
    await api.trigger(job["id"])
    target = await target_of(api, job["id"], 1)
    await write_object(target, "agg-0-a1.state", b"written, then the executor died")
    assert (await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={})).status_code == 201
    assert await under(api, target["prefix"]) == set()


async def test_retention_deletes_by_prefix_but_never_a_savepoint_or_the_latest(store_api):
    api = store_api
    job = await api.job(retained=1)
    savepoint, _ = await complete_written(api, job, "sp", savepoint=True)
    first, _ = await complete_written(api, job, "one")
    latest, _ = await complete_written(api, job, "two")

    async def first_gone():
        return not await under(api, checkpoint_prefix(job["id"], first))

    await api.wait_for(first_gone, what="checkpoint 2's prefix deleted (in the background, after the ack)")
    async with api.ctx.tx(readonly=True) as s:
        rows = (await s.execute(select(BlobRow.checkpoint_id, BlobRow.status).where(BlobRow.job_id == job["id"]))).all()
    status = {cp: {st for c, st in rows if c == cp} for cp in (savepoint, first, latest)}
    assert status[savepoint] == status[latest] == {"stored"}
    assert "stored" not in status[first]  # released with the discard, in the completing ack's transaction
    assert len(await under(api, checkpoint_prefix(job["id"], savepoint))) == 4
    assert len(await under(api, checkpoint_prefix(job["id"], latest))) == 4
    assert (await api.checkpoint(job["id"], first))["discarded"] is True
    await api.ctx.sweep_state(now=2**62)  # whenever the sweep comes: still there
    assert len(await under(api, checkpoint_prefix(job["id"], savepoint))) == 4
    assert len(await under(api, checkpoint_prefix(job["id"], latest))) == 4


async def test_a_completing_acks_answer_comes_before_the_cleaning_of_what_its_commit_released(store_api, monkeypatch):
    """The ack that completes a checkpoint releases the checkpoints retention discards; their prefixes are cleaned
    in the background `CLEANUP_DELAY` after the commit, so the answers waiting for that commit go out first (a
    cleaning started at once ran its first step between the commit and the answers). It cleans without the sweep."""
    from app.domain import context

    api = store_api
    started: list[list[tuple[int, int]]] = []
    clean_all = api.ctx.cleaner.clean_all

    async def recording(checkpoints, now):
        started.append(list(checkpoints))
        await clean_all(checkpoints, now)

    async def no_sweep(now, limit=200):  # only the deferred cleaning cleans in this test
        return 0

    monkeypatch.setattr(api.ctx.cleaner, "clean_all", recording)
    monkeypatch.setattr(api.ctx.cleaner, "sweep", no_sweep)
    monkeypatch.setattr(context, "CLEANUP_DELAY", 3600.0)
    job = await api.job(retained=1)
    first, _ = await complete_written(api, job, "one")
    second, _ = await complete_written(api, job, "two")  # the transaction of its last ack discards the first
    for _ in range(20):
        await asyncio.sleep(0)  # the event loop turns on after the answers
    assert started == []
    assert (await api.checkpoint(job["id"], first))["discarded"] is True
    assert await under(api, checkpoint_prefix(job["id"], first))
    (waiting,) = [t for t in api.ctx._background if t.get_name() == "overtake-cleanup"]
    waiting.cancel()

    monkeypatch.setattr(context, "CLEANUP_DELAY", 0.01)
    await complete_written(api, job, "three")  # discards the second

    async def second_gone():
        return not await under(api, checkpoint_prefix(job["id"], second))

    await api.wait_for(second_gone, what="the second checkpoint's prefix cleaned by the deferred cleaning")
    assert started == [[(job["id"], second)]]


async def _timeout_at(api, job_id: int, cp_id: int) -> int:
    async with api.ctx.tx(readonly=True) as s:
        return (await s.get(CheckpointRow, (job_id, cp_id))).timeout_at


async def test_an_object_written_after_its_checkpoint_aborted_is_collected_once_the_checkpoint_timed_out(store_api):
    api = store_api
    job = await api.job(tolerable_failures=5)
    await api.trigger(job["id"])
    target = await target_of(api, job["id"], 1)
    await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/1/declines",
        json={"attempt": 1, "vertex": "src", "subtask_index": 1, "reason": "no"},
    )
    # a subtask that has not heard of the abort writes its object, then crashes before acking
    late = await write_object(target, "agg-0-a1.state", b"too late")
    grace = int(api.ctx.settings.late_write_grace * 1000)
    until = await _timeout_at(api, job["id"], 1) + grace
    await api.ctx.sweep_state(now=until - 1)  # it might still be written to: left alone
    assert late in await stored_keys(api)
    await api.ctx.sweep_state(now=until)
    assert await under(api, target["prefix"]) == set()
    async with api.ctx.tx(readonly=True) as s:
        assert (await s.get(CheckpointRow, (job["id"], 1))).cleanup is None


async def test_a_completed_checkpoints_unacked_objects_are_collected_and_its_acked_ones_kept(store_api):
    api = store_api
    job = await api.job(retained=3)
    cp, state = await complete_written(api, job, "one")
    target = await target_of(api, job["id"], cp)
    stray = await write_object(target, "agg-0-a1-retry.state", b"written before a crash, never acked")
    orphan = (await api.upload(job["id"], cp, "agg", 0, b"x", kind="channel")).status_code
    assert orphan == 409  # a completed checkpoint takes no uploads
    until = await _timeout_at(api, job["id"], cp) + int(api.ctx.settings.late_write_grace * 1000)
    await api.ctx.sweep_state(now=until - 1)
    assert stray in await stored_keys(api)
    await api.ctx.sweep_state(now=until)
    assert await under(api, target["prefix"]) == {key for key, *_ in state.values()}
    plan = (await api.client.get(f"/api/v1/jobs/{job['id']}/restore-plan")).json()
    assert plan["checkpoint_id"] == cp and plan["fallbacks"] == []


def _objects_in_bucket(store: S3BlobStore) -> set[str]:
    """Every object in the store's bucket, as S3 lists them (s3fs's listing leaves out keys ending in '/'), but the
    marker by which the deployment claimed the store."""
    import boto3

    pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=store.bucket)
    return {o["Key"] for page in pages for o in page.get("Contents", []) if not o["Key"].endswith(MARKER)}


@pytest.mark.parametrize("name", ["", "name/"], ids=["the-prefix-itself", "ending-in-a-slash"])
async def test_an_s3_object_whose_key_ends_in_a_slash_goes_with_its_checkpoints_prefix(make_api, s3_bucket, name):
    """A presigned POST admits any key under the prefix, the prefix itself and ``name/`` too; S3 stores those as
    objects like any other, and cleaning by prefix deletes them with the rest (aborted, and pruned when completed)."""
    async with make_api(blob_url=s3_bucket) as api:
        job = await api.job(tolerable_failures=5, retained=3)
        await api.trigger(job["id"])
        aborted = await target_of(api, job["id"], 1)
        await write_object(aborted, name, b"written by a subtask's bug, never acked")
        await api.client.post(
            f"/api/v1/jobs/{job['id']}/checkpoints/1/declines",
            json={"attempt": 1, "vertex": "src", "subtask_index": 1, "reason": "no"},
        )
        cp, state = await complete_written(api, job, "one")
        completed = await target_of(api, job["id"], cp)
        await write_object(completed, name, b"written by a subtask's bug, never acked")
        base = api.ctx.store.base
        assert base + completed["prefix"] + name in _objects_in_bucket(api.ctx.store)
        await api.ctx.sweep_state(now=2**46)
        assert _objects_in_bucket(api.ctx.store) == {base + key for key, *_ in state.values()}


async def test_a_blob_uploaded_but_never_acked_is_collected_with_its_row(store_api):
    api = store_api
    job = await api.job(retained=3)
    await api.trigger(job["id"])
    orphan = (await api.upload(job["id"], 1, "agg", 0, b"uploaded, then the subtask crashed")).json()
    await api.ack_all(job, 1)  # acked without state (a restarted subtask that had none)
    until = await _timeout_at(api, job["id"], 1) + int(api.ctx.settings.late_write_grace * 1000)
    await api.ctx.sweep_state(now=until)
    assert await under(api, checkpoint_prefix(job["id"], 1)) == set()
    assert await rows(api, BlobRow, id=orphan["blob_id"]) == 0


def _undeletable(path: Path):
    """Make `path` (a file) impossible to delete for this process, with the file system's own means; returns the
    function that undoes it. Skips where neither works."""
    if os.geteuid() == 0:
        done = subprocess.run(["chattr", "+i", str(path)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot make a file undeletable as root here (chattr: {done.stderr.decode().strip()})")
        return lambda: subprocess.run(["chattr", "-i", str(path)], check=True)
    path.parent.chmod(0o500)
    return lambda: path.parent.chmod(0o700)


async def test_a_deletion_that_failed_is_retried_by_the_sweep(sqlite_api):
    api = sqlite_api
    job = await api.job(tolerable_failures=5)
    await api.trigger(job["id"])
    target = await target_of(api, job["id"], 1)
    key = await write_object(target, "agg-0-a1.state", b"state")
    restore = _undeletable(api.ctx.store.root / key)
    try:
        await api.client.post(
            f"/api/v1/jobs/{job['id']}/checkpoints/1/declines",
            json={"attempt": 1, "vertex": "src", "subtask_index": 1, "reason": "no"},
        )
        assert key in await stored_keys(api)  # the deletion failed; the checkpoint still says what is left
        async with api.ctx.tx(readonly=True) as s:
            cp = await s.get(CheckpointRow, (job["id"], 1))
            assert cp.cleanup == "prefix" and cp.cleanup_at is not None
            retry_at = cp.cleanup_at
    finally:
        restore()
    await api.ctx.sweep_state(now=retry_at)
    assert await under(api, target["prefix"]) == set()


# --------------------------------------------------------------------------- restore plans read the store


async def test_a_restore_plans_locations_read_back_the_exact_bytes(store_api):
    api = store_api
    job = await api.job(retained=3)
    cp, state = await complete_written(api, job, "one")
    attempt = (await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={})).json()
    plan = attempt["restore_plan"]
    assert plan["checkpoint_id"] == cp and plan["fallbacks"] == []
    presigned = not isinstance(api.ctx.store, FileBlobStore)
    for sub in plan["subtasks"]:
        key, op, out, inp = state[(sub["vertex"], sub["subtask_index"])]
        where = {loc["blob_id"]: loc for loc in sub["blobs"]}
        named = {s["blob_id"] for s in sub["operator_state"]}
        named |= {s["blob_id"] for s in sub["output_channel_state"] + sub["input_channel_state"]}
        assert set(where) == named
        for loc in where.values():
            assert loc["url"] is not None and (loc["expires_at"] is not None) == presigned
            assert key.rsplit("/", 1)[1] in loc["url"]
        (operator,) = sub["operator_state"]
        assert await read_location(where[operator["blob_id"]]) == op
        for seg, expected in ((sub["output_channel_state"], out), (sub["input_channel_state"], inp)):
            if not expected:
                assert seg == []
                continue
            (s,) = seg
            assert await read_location(where[s["blob_id"]], s["offset"], s["length"]) == expected


async def test_blobs_uploaded_through_the_coordinator_are_read_from_the_store_too(store_api):
    api = store_api
    job = await api.job({"agg": 1})
    cp = (await api.trigger(job["id"])).json()["id"]
    info = (await api.upload(job["id"], cp, "agg", 0, b"uploaded operator state", kind="operator")).json()
    ref = {k: info[k] for k in ("blob_id", "sha256", "size")}
    assert (await api.ack(job["id"], cp, "agg", 0, operator_state=ref)).json()["status"] == "COMPLETED"
    plan = (await api.client.get(f"/api/v1/jobs/{job['id']}/restore-plan")).json()
    (loc,) = plan["subtasks"][0]["blobs"]
    assert loc["blob_id"] == info["blob_id"] and loc["offset"] == 0
    assert await read_location(loc) == b"uploaded operator state"


async def test_a_plan_names_only_objects_under_its_own_jobs_prefix(store_api):
    api = store_api
    a, b = await api.job(retained=3), await api.job(retained=3)
    await complete_written(api, a, "a")
    await complete_written(api, b, "b")
    for job, other in ((a, b), (b, a)):
        plan = (await api.client.get(f"/api/v1/jobs/{job['id']}/restore-plan")).json()
        urls = [loc["url"] for sub in plan["subtasks"] for loc in sub["blobs"]]
        assert urls and all(f"/job-{job['id']}/cp-" in u for u in urls)
        assert not any(f"/job-{other['id']}/" in u for u in urls)


async def test_a_cut_written_object_makes_the_plan_fall_back_without_reading_it(store_api):
    api = store_api
    job = await api.job(retained=3)
    older, _ = await complete_written(api, job, "one")
    newer, state = await complete_written(api, job, "two")
    key, op, out, inp = state[("agg", 1)]
    target = await target_of(api, job["id"], newer)
    await write_object(target, key.rsplit("/", 1)[1], op + out)  # overwritten, cut short
    plan = (await api.client.get(f"/api/v1/jobs/{job['id']}/restore-plan")).json()
    assert plan["checkpoint_id"] == older
    assert plan["fallbacks"][0]["checkpoint_id"] == newer and key in plan["fallbacks"][0]["reason"]


async def test_an_object_replaced_by_a_directory_makes_a_hashing_plan_fall_back(make_api):
    """With OVERTAKE_VERIFY_BLOBS_ON_RESTORE=sha256 the plan reads each blob: a directory where an acked object was
    is no object (as for a stat), so the plan passes over its checkpoint, and the new attempt starts from the older."""
    async with make_api(verify_blobs_on_restore="sha256") as api:
        job = await api.job(retained=3)
        older, _ = await complete_written(api, job, "one")
        newer, state = await complete_written(api, job, "two")
        key = state[("agg", 1)][0]
        path = api.ctx.store.root / key
        path.unlink()
        path.mkdir()
        r = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={})
        assert r.status_code == 201, r.text
        plan = r.json()["restore_plan"]
        assert plan["checkpoint_id"] == older
        assert plan["fallbacks"][0]["checkpoint_id"] == newer and key in plan["fallbacks"][0]["reason"]


@asynccontextmanager
async def unreachable(make_api, monkeypatch):
    """The coordinator again, on the same database, with its S3 endpoint where nothing listens."""
    import s3fs

    from app.local import free_port

    endpoint = os.environ["AWS_ENDPOINT_URL"]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # the client gives up at once (s3fs still tries a few times)
    s3fs.S3FileSystem.clear_instance_cache()  # the coordinator's client is made again, for that endpoint
    try:
        async with make_api(blob_url=os.environ["OVERTAKE_TEST_BLOB_URL"]) as api:
            yield api
    finally:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        monkeypatch.delenv("AWS_MAX_ATTEMPTS")
        s3fs.S3FileSystem.clear_instance_cache()


async def test_a_store_that_cannot_be_reached_makes_a_restore_503_and_changes_nothing(make_api, s3_bucket, monkeypatch):
    """Whether the objects are there is unknown then: no plan (neither the checkpoint nor a fallback past it),
    no new attempt, a 503 naming the object; the same restore works once the store answers."""
    monkeypatch.setenv("OVERTAKE_TEST_BLOB_URL", s3_bucket)
    async with make_api(blob_url=s3_bucket) as api:
        job = await api.job(retained=3)
        cp, _ = await complete_written(api, job, "one")
    async with unreachable(make_api, monkeypatch) as api:
        r = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={})
        assert r.status_code == 503, r.text
        assert f"job-{job['id']}/cp-" in r.json()["error"]["message"] and "retry" in r.json()["error"]["message"]
        attempts = (await api.client.get(f"/api/v1/jobs/{job['id']}/attempts")).json()
        assert [a["attempt"] for a in attempts["items"]] == [1]
    async with make_api(blob_url=s3_bucket) as api:
        r = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={})
        assert r.status_code == 201 and r.json()["restore_plan"]["checkpoint_id"] == cp, r.text


async def test_a_store_that_cannot_be_reached_makes_blob_reads_and_uploads_503(make_api, s3_bucket, monkeypatch):
    monkeypatch.setenv("OVERTAKE_TEST_BLOB_URL", s3_bucket)
    async with make_api(blob_url=s3_bucket) as api:
        job = await api.job(retained=3)
        await complete_written(api, job, "one")
        blob_id = (await api.client.get(f"/api/v1/jobs/{job['id']}/restore-plan")).json()["subtasks"][0]["blobs"][0]
        await api.trigger(job["id"])
    async with unreachable(make_api, monkeypatch) as api:
        read = await api.client.get(f"/api/v1/jobs/{job['id']}/blobs/{blob_id['blob_id']}")
        assert read.status_code == 503 and "did not answer" in read.json()["error"]["message"], read.text
        upload = await api.upload(job["id"], 2, "agg", 0, b"state")
        assert upload.status_code == 503 and "did not answer" in upload.json()["error"]["message"], upload.text
        assert await rows(api, BlobRow, job_id=job["id"], checkpoint_id=2) == 0


async def test_a_corrupt_report_makes_the_next_plan_fall_back_naming_blob_and_reporter(store_api):
    api = store_api
    job = await api.job(retained=3)
    older, _ = await complete_written(api, job, "one")
    newer, _ = await complete_written(api, job, "two")
    plan = (await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={})).json()["restore_plan"]
    assert plan["checkpoint_id"] == newer
    sub = next(s for s in plan["subtasks"] if (s["vertex"], s["subtask_index"]) == ("agg", 1))
    blob_id = sub["input_channel_state"][0]["blob_id"]
    report = {"attempt": 2, "vertex": "agg", "subtask_index": 1, "reason": "sha256 mismatch at byte 17"}
    path = f"/api/v1/jobs/{job['id']}/blobs/{blob_id}/corrupt"
    first = await api.client.post(path, json=report)
    assert first.status_code == 200, first.text
    assert "agg[1]" in first.json()["corrupt"] and "sha256 mismatch" in first.json()["corrupt"]
    again = await api.client.post(path, json={**report, "reason": "said twice"})
    assert again.status_code == 200 and again.json()["corrupt"] == first.json()["corrupt"]
    plan = (await api.client.get(f"/api/v1/jobs/{job['id']}/restore-plan")).json()
    assert plan["checkpoint_id"] == older
    (fallback,) = plan["fallbacks"]
    assert fallback["checkpoint_id"] == newer
    assert blob_id in fallback["reason"] and "agg[1]" in fallback["reason"] and "attempt 2" in fallback["reason"]
    nxt = (await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={})).json()
    assert nxt["restore_plan"]["checkpoint_id"] == older
    assert nxt["restore_plan"]["fallbacks"][0]["checkpoint_id"] == newer


async def test_corrupt_reports_that_cannot_apply_are_refused_and_change_nothing(store_api):
    api = store_api
    job, other = await api.job(retained=3), await api.job(retained=3)
    _, state = await complete_written(api, job, "one")
    await complete_written(api, other, "other")
    plan = (await api.client.get(f"/api/v1/jobs/{job['id']}/restore-plan")).json()
    blob_id = plan["subtasks"][0]["blobs"][0]["blob_id"]
    theirs = (await api.client.get(f"/api/v1/jobs/{other['id']}/restore-plan")).json()["subtasks"][0]["blobs"][0]
    report = {"attempt": 1, "vertex": "src", "subtask_index": 0, "reason": "bad"}
    cases = [
        (f"/api/v1/jobs/{job['id']}/blobs/{blob_id}/corrupt", {**report, "attempt": 2}, 409),
        (f"/api/v1/jobs/{job['id']}/blobs/{blob_id}/corrupt", {**report, "vertex": "nope"}, 404),
        (f"/api/v1/jobs/{job['id']}/blobs/{theirs['blob_id']}/corrupt", report, 404),
        (f"/api/v1/jobs/{job['id']}/blobs/{'0' * 32}/corrupt", report, 404),
        (f"/api/v1/jobs/{job['id']}/blobs/not-a-blob-id/corrupt", report, 422),
        (f"/api/v1/jobs/{job['id']}/blobs/{blob_id}/corrupt", {**report, "reason": "x" * 2001}, 422),
    ]
    for path, body, status in cases:
        r = await api.client.post(path, json=body)
        assert r.status_code == status, (path, body, r.text)
    async with api.ctx.tx(readonly=True) as s:
        assert (await s.execute(select(func.count()).where(BlobRow.corrupt.is_not(None)))).scalar_one() == 0


# --------------------------------------------------------------------------- the through-coordinator fallback


async def test_with_state_writes_coordinator_no_target_is_handed_out_and_uploads_work_as_before(make_api):
    async with make_api(state_writes="coordinator") as api:
        job = await api.job({"agg": 1})
        cp = (await api.trigger(job["id"])).json()["id"]
        assert (await target_of(api, job["id"], cp)) is None
        refused = await api.ack(
            job["id"], cp, "agg", 0, written=written(checkpoint_prefix(job["id"], cp) + "agg-0-a1.state", b"s", b"")
        )
        assert refused.status_code == 422 and "OVERTAKE_STATE_WRITES=coordinator" in refused.json()["error"]["message"]
        report = {"attempt": 1, "vertex": "agg", "subtask_index": 0,
                  "operator_state": {"sha256": __import__("hashlib").sha256(b"op").hexdigest(), "size": 2}}
        r = await api.client.post(
            f"/api/v1/jobs/{job['id']}/checkpoints/{cp}/acks/with-state",
            files={"ack": (None, json.dumps(report).encode(), "application/json"),
                   "operator_state": ("operator_state", b"op", "application/octet-stream")},
        )
        assert r.status_code == 200 and r.json()["status"] == "COMPLETED", r.text
        plan = (await api.client.get(f"/api/v1/jobs/{job['id']}/restore-plan")).json()
        (loc,) = plan["subtasks"][0]["blobs"]
        assert loc["url"] is None and loc["size"] == 2  # read through the coordinator
        data = await api.client.get(f"/api/v1/jobs/{job['id']}/blobs/{loc['blob_id']}")
        assert data.content == b"op"


# --------------------------------------------------------------------------- scopes, as properties


ids = st.integers(min_value=1, max_value=2**63 - 1)


@given(job=ids, cp=ids, other_job=ids, other_cp=ids)
@settings(max_examples=200, deadline=None)
def test_one_checkpoints_prefix_never_holds_another_jobs_or_checkpoints_keys(job, cp, other_job, other_cp):
    mine, theirs = checkpoint_prefix(job, cp), checkpoint_prefix(other_job, other_cp)
    assert re.fullmatch(STATE_KEY_PATTERN, mine + "agg-0-a1.state")
    assert mine.startswith(f"job-{job}/")
    if (job, cp) != (other_job, other_cp):
        assert not (theirs + "agg-0-a1.state").startswith(mine)


@given(job=ids, cp=ids)
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_coordinator_never_grants_a_write_or_a_read_outside_the_jobs_prefix(s3_bucket, tmp_path, job, cp):
    """S3 does the enforcing (moto does not check POST policies), so what is checked here is what the coordinator
    signs: a POST policy whose every key condition is the checkpoint's prefix, GETs of keys of the job only."""
    prefix = checkpoint_prefix(job, cp)
    s3 = S3BlobStore(s3_bucket, staging_dir=tmp_path)
    post = s3.presigned_post(prefix, 60, 1000)
    policy = json.loads(base64.b64decode(post["fields"]["policy"]))
    keys = [c for c in policy["conditions"] if isinstance(c, list) and c[1] == "$key"]
    assert keys and all(c == ["starts-with", "$key", f"overtake/{prefix}"] for c in keys)
    assert not any(isinstance(c, dict) and "key" in c for c in policy["conditions"])
    assert post["fields"]["key"].startswith(f"overtake/{prefix}")
    key = prefix + "agg-0-a1.state"
    (url,) = asyncio.run(s3.read_urls([key], 60)).values()
    assert urlparse(url).path == f"/{s3.bucket}/overtake/{key}"
    files = FileBlobStore((tmp_path / "blobs").as_uri())
    target = asyncio.run(files.write_target(prefix, 0, 1000))
    assert target.prefix == prefix and target.url == files.root.as_uri() + "/"
    (path,) = asyncio.run(files.read_urls([key], 60)).values()
    assert path == (files.root / key).as_uri() and (files.root / key).is_relative_to(files.root / f"job-{job}")
    for outside in ("..", "../x", f"job-{job}/cp-1/x", "job-x/cp-000000000001/y", f"{prefix}a/b", f"{prefix}.x"):
        with pytest.raises(Invalid):
            asyncio.run(files.read_urls([outside], 60))
        with pytest.raises(Invalid):
            asyncio.run(s3.read_urls([outside], 60))


@pytest.mark.parametrize(
    "value, mode", [("stat", "stat"), ("sha256", "sha256"), (True, "sha256"), ("false", "stat"), ("1", "sha256")]
)
def test_the_restore_verification_setting_takes_its_modes_and_the_old_booleans(value, mode, tmp_path):
    assert Settings(data_dir=tmp_path, verify_blobs_on_restore=value).verify_blobs_on_restore == mode


@pytest.mark.parametrize("setting, value", [("verify_blobs_on_restore", "md5"), ("state_writes", "sometimes")])
def test_unknown_modes_are_refused_at_start_up(setting, value, tmp_path):
    with pytest.raises(ValidationError, match=setting):
        Settings(data_dir=tmp_path, **{setting: value})


async def test_concurrent_stats_of_a_file_store_run_in_one_thread_hop_and_each_gets_its_own_answer(
    tmp_path, monkeypatch
):
    import app.blobstore.local as blobstore  # the file store and its batched stat live there

    store = FileBlobStore(tmp_path.as_uri())
    store.local = False  # as on a network file system (on a local one the stats run on the event loop)
    prefix = checkpoint_prefix(3, 9)
    (tmp_path / prefix).mkdir(parents=True)
    for i in range(40):
        (tmp_path / prefix / f"s{i}.state").write_bytes(b"x" * i)
    (tmp_path / prefix / "dir.state").mkdir()
    (tmp_path / prefix / "link.state").symlink_to(tmp_path / prefix / "s5.state")
    hops: list[int] = []
    real = blobstore._lstat_sizes
    monkeypatch.setattr(blobstore, "_lstat_sizes", lambda paths: hops.append(len(paths)) or real(paths))
    keys = [f"{prefix}s{i}.state" for i in range(40)] + [f"{prefix}{n}.state" for n in ("gone", "dir", "link")]
    sizes = await asyncio.gather(*(store.size(k) for k in keys))
    assert sizes == [*range(40), None, None, None]  # missing, a directory and a link are no objects
    assert hops == [43]
    # a caller that stops waiting leaves the others their answers
    waiting = [asyncio.ensure_future(store.size(k)) for k in keys[:3]]
    await asyncio.sleep(0)
    waiting[1].cancel()
    done = await asyncio.gather(*waiting, return_exceptions=True)
    assert done[0] == 0 and done[2] == 2 and isinstance(done[1], asyncio.CancelledError)


# ------------------------------------------------------------------------------------------------ stats of acks


MOUNTS = """/dev/vda / ext4 rw,relatime 0 0
tmpfs /dev/shm tmpfs rw 0 0
server:/export /mnt/shared nfs4 rw,relatime,vers=4.2 0 0
/dev/vdb /mnt/shared/local\\040disk xfs rw 0 0
"""


@pytest.mark.parametrize(
    "path, fstype",
    [
        ("/srv/overtake", "ext4"),
        ("/mnt/shared/checkpoints", "nfs4"),
        ("/mnt/shared", "nfs4"),
        ("/mnt/sharedother", "ext4"),  # a mount point is a whole path component, not a prefix of a name
        ("/mnt/shared/local disk/x", "xfs"),  # the table escapes a space as \040
        ("/dev/shm/cp", "tmpfs"),
    ],
)
def test_the_file_system_of_a_directory_is_that_of_its_longest_mount_point(path, fstype):
    from app.blobstore import filesystem_type

    assert filesystem_type(Path(path), MOUNTS) == fstype


async def test_on_a_local_file_system_acks_are_stated_without_a_thread_hop_and_a_bad_key_fails_alone(tmp_path, monkeypatch):
    """A hop to a worker thread waits for the thread to be scheduled (milliseconds on a machine whose cores the
    pipeline's workers take); a stat on a local disk takes microseconds. A network file system keeps the hop."""
    store = FileBlobStore(f"file://{tmp_path}")
    assert store.local  # the tests' temporary directory is on a local disk
    prefix = checkpoint_prefix(7, 12)
    (tmp_path / prefix).mkdir(parents=True)
    (tmp_path / prefix / "a").write_bytes(b"x" * 5)
    (tmp_path / prefix / "d").mkdir()
    hops = []
    loop = asyncio.get_running_loop()
    real = loop.run_in_executor

    def counting(executor, fn, *args):
        hops.append(fn)
        return real(executor, fn, *args)

    monkeypatch.setattr(loop, "run_in_executor", counting)
    a, missing, d = prefix + "a", prefix + "missing", prefix + "d"
    sizes = await store.sizes([a, missing, d, prefix + "../escape"])
    assert sizes[:3] == [5, None, None]  # a directory is no object
    assert isinstance(sizes[3], Invalid)
    assert await store.size(a) == 5
    assert hops == []
    store.local = False  # as on NFS
    assert await store.sizes([a, missing]) == [5, None]
    assert await store.size(a) == 5
    assert len(hops) == 2


async def test_acks_of_objects_in_a_local_store_are_checked_inline_and_elsewhere_within_a_bound(store_api, monkeypatch):
    """On a local file system the check has nothing to wait for, so it runs in the ack's own turn of the event loop
    (a task bounded by `wait_for` would run on a later turn of a busy loop); any other store's check is bounded."""
    import app.domain.written as written_mod

    api = store_api
    bounded = []
    real = written_mod.asyncio.wait_for

    async def wait_for(aw, timeout):
        bounded.append(timeout)
        return await real(aw, timeout)

    monkeypatch.setattr(written_mod.asyncio, "wait_for", wait_for)
    job = await api.job(retained=1)
    await complete_written(api, job, "one")
    local = getattr(api.ctx.store, "local", False)
    assert local == isinstance(api.ctx.store, FileBlobStore)  # the tests' directories are on a local disk
    assert bounded == ([] if local else [written_mod.STAT_TIMEOUT] * 4)


async def test_a_symbolic_link_in_a_shared_store_never_makes_the_coordinator_read_or_delete_outside_it(api, tmp_path):
    """Subtasks create the directories of a file store themselves. A directory that is a link to elsewhere must not
    let an ack count a file outside the store (the blob route would then serve it), nor a cleaning delete there."""
    store = api.ctx.store
    assert isinstance(store, FileBlobStore)
    outside = tmp_path / "outside"
    (outside / "cp-000000000001").mkdir(parents=True)
    secret = b"a file of the coordinator's machine, outside the store"
    (outside / "secret.state").write_bytes(secret)
    (outside / "cp-000000000001" / "agg-0-a1.state").write_bytes(secret)
    reader = await api.job(tolerable_failures=5)
    await api.trigger(reader["id"])
    prefix = (await target_of(api, reader["id"], 1))["prefix"]
    link = store.root / prefix.rstrip("/")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside, target_is_directory=True)
    r = await api.ack(reader["id"], 1, "agg", 0, written=written(prefix + "secret.state", secret, b""))
    assert r.status_code == 422 and "does not exist" in r.json()["error"]["message"], r.text
    assert await rows(api, AckRow, job_id=reader["id"]) == 0
    deleter = await api.job(tolerable_failures=5)
    job_dir = store.root / f"job-{deleter['id']}"
    if job_dir.exists():
        job_dir.rmdir()
    job_dir.symlink_to(outside, target_is_directory=True)
    await api.trigger(deleter["id"])
    r = await api.client.post(
        f"/api/v1/jobs/{deleter['id']}/checkpoints/1/declines",
        json={"attempt": 1, "vertex": "src", "subtask_index": 0, "reason": "disk full"},
    )
    assert r.status_code == 200 and r.json()["status"] == "ABORTED"
    await api.ctx.sweep_state(now=2**46)
    assert (outside / "secret.state").read_bytes() == secret
    assert (outside / "cp-000000000001" / "agg-0-a1.state").read_bytes() == secret


def test_a_key_or_prefix_followed_by_a_newline_is_not_one():
    """A regular expression's `$` also matches before a final newline: the store's own checks match whole strings."""
    from app.blobstore import _check_prefix, is_key
    from app.errors import Invalid

    key, prefix = "job-1/cp-000000000001/a-0.state", "job-1/cp-000000000001/"
    assert is_key(key) and not is_key(key + "\n") and not is_key("job-1/" + "0" * 32 + "\n")
    assert _check_prefix(prefix) == prefix
    with pytest.raises(Invalid):
        _check_prefix(prefix + "\n")


async def test_a_store_that_fails_one_stat_of_a_restore_leaves_no_other_stat_running(store_api, monkeypatch):
    """The plan's objects are stat'ed a few at a time; the first that fails answers the restore 503. The others are
    cancelled then: left running, each would wait its whole bound on a store that does not answer, after the
    request was answered and again for each retried restore."""
    api = store_api
    job = await api.job(retained=3)
    await complete_written(api, job, "one")
    started, cancelled = [], []

    async def size(key: str) -> int | None:
        started.append(key)
        if len(started) == 1:
            raise OSError("the store refused the connection")
        try:
            await asyncio.Event().wait()  # a store that never answers
        except asyncio.CancelledError:
            cancelled.append(key)
            raise
        return None

    monkeypatch.setattr(api.ctx.store, "size", size)
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={})
    assert r.status_code == 503 and "did not answer" in r.json()["error"]["message"], r.text
    assert len(started) == sum(p for _, p in JOB_VERTICES)  # one object per subtask, all asked at once
    assert sorted(cancelled) == sorted(started[1:])


async def test_a_hashing_restore_whose_store_stops_answering_mid_read_is_answered_503_within_its_bound(
    make_api, monkeypatch
):
    """With OVERTAKE_VERIFY_BLOBS_ON_RESTORE=sha256 each blob is read whole: a read that never ends is bounded (a
    stat's bound plus the blob's bytes at the slowest rate a store may have), answered 503 naming the object, and
    opens no attempt."""
    from app.domain import written as written_state

    async with make_api(verify_blobs_on_restore="sha256") as api:
        job = await api.job(retained=3)
        await complete_written(api, job, "one")
        monkeypatch.setattr(written_state, "STAT_TIMEOUT", 0.2)

        async def sha256(key: str, start: int = 0, length: int | None = None) -> str | None:
            await asyncio.Event().wait()  # the store took the request and never answers

        monkeypatch.setattr(api.ctx.store, "sha256", sha256)
        r = await asyncio.wait_for(api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={}), 30)
        assert r.status_code == 503 and r.headers.get("retry-after"), r.text
        message = r.json()["error"]["message"]
        assert f"job-{job['id']}/cp-" in message and "within 0.2 s" in message, message
        assert (await api.client.get(f"/api/v1/jobs/{job['id']}")).json()["current_attempt"] == 1
