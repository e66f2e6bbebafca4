"""Incremental channel state on the coordinator: an ack's channel segments may reference ranges of objects earlier
completed checkpoints of the same job wrote; the references are checked under the job row lock, recorded, keep the
referenced prefixes through retention and go with an abort; restore plans say where every part lies."""

from __future__ import annotations

from sqlalchemy import select

from app.blobstore import checkpoint_prefix
from app.db.models import AckRow, BlobRow, ChannelStateRefRow, CheckpointRow
from tests.coordinator._state import read_location, target_of, write_object, written
from tests.coordinator.test_state_store import complete_written, rows, under


def _input_segment(i: int, parts: list[dict]) -> dict:
    return {
        "channel": f"in:src[0]->agg[{i}]",
        "direction": "input",
        "offset": next((p["offset"] for p in parts if p.get("key") is None), 0),
        "length": sum(p["length"] for p in parts),
        "buffer_count": len(parts),
        "record_count": len(parts),
        "partitioning": "hash",
        "parts": parts,
    }


async def complete_referencing(api, job: dict, earlier: dict, tag: str, *, complete: bool = True, attempt: int = 1):
    """Take a checkpoint whose agg subtasks' input channel state is the input state of ``earlier`` (a state map of
    `complete_written`) referenced where it lies, then (agg[0] only) bytes of their own; the other subtasks write as
    usual.
    Returns (checkpoint id, {(vertex, index): (key, operator bytes, expected input segment bytes)})."""
    r = await api.trigger(job["id"])
    assert r.status_code == 201, r.text
    cp = r.json()["id"]
    target = await target_of(api, job["id"], cp)
    state = {}
    for v, p in (("src", 2), ("agg", 2)):
        for i in range(p):
            if not complete and (v, i) != ("agg", 0):
                continue
            op = f"{tag}:{v}[{i}] operator state".encode()
            # agg[1] has nothing new: its channel state lies wholly in the earlier object
            new = f"{tag}:{v}[{i}] in".encode() if (v, i) == ("agg", 0) else b""
            key = await write_object(target, f"{v}-{i}-a{attempt}.state", op + new)
            extra = {"written": written(key, op, new)}
            expected = b""
            if v == "agg":
                old_key, _, old_out, old_inp = earlier[(v, i)]
                parts = [{"key": old_key, "offset": len(old_out), "length": len(old_inp)}]
                parts += [{"offset": 0, "length": len(new)}] if new else []
                extra["channel_segments"] = [_input_segment(i, parts)]
                extra["key_group_start"], extra["key_group_end"] = (0, 7) if i == 0 else (8, 15)
                expected = old_inp + new
            r = await api.ack(job["id"], cp, v, i, attempt, **extra)
            assert r.status_code == 200, r.text
            state[(v, i)] = (key, op, expected)
    return cp, state


async def test_trigger_events_say_references_are_taken_when_the_job_asks_and_never_for_savepoints(store_api):
    api = store_api
    plain = await api.job()
    job = await api.job(incremental_channel_state=True, max_concurrent=2)
    await api.trigger(plain["id"])
    await api.trigger(job["id"])
    savepoint = (await api.client.post(f"/api/v1/jobs/{job['id']}/savepoints", json={})).json()["id"]
    assert (await target_of(api, plain["id"], 1))["incremental"] is False
    assert (await target_of(api, job["id"], 1))["incremental"] is True
    assert (await target_of(api, job["id"], savepoint))["incremental"] is False


async def test_a_reference_to_an_earlier_retained_checkpoint_of_the_same_job_is_accepted_and_restored(store_api):
    api = store_api
    job = await api.job(retained=2, incremental_channel_state=True)
    first, earlier = await complete_written(api, job, "one")
    cp, state = await complete_referencing(api, job, earlier, "two")
    assert (await api.checkpoint(job["id"], cp))["status"] == "COMPLETED"
    async with api.ctx.tx(readonly=True) as s:
        refs = (await s.execute(select(ChannelStateRefRow).where(ChannelStateRefRow.job_id == job["id"]))).scalars()
        assert {(r.checkpoint_id, r.vertex, r.subtask_index, r.key, r.ref_checkpoint_id) for r in refs} == {
            (cp, "agg", i, earlier[("agg", i)][0], first) for i in range(2)
        }
    plan = (await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={})).json()["restore_plan"]
    assert plan["checkpoint_id"] == cp and plan["fallbacks"] == []
    for sub in plan["subtasks"]:
        if sub["vertex"] != "agg":
            continue
        where = {loc["blob_id"]: loc for loc in sub["blobs"]}
        (seg,) = sub["input_channel_state"]
        got = b""
        for part in seg["parts"]:
            blob_id = part["blob_id"] or seg["blob_id"]
            got += await read_location(where[blob_id], part["offset"], part["length"])
        assert got == state[("agg", sub["subtask_index"])][2]
        assert (seg["blob_id"] is None) == (sub["subtask_index"] == 1)
    manifest = (await api.client.get(f"/api/v1/jobs/{job['id']}/checkpoints/{cp}/channel-state")).json()
    assert {(e["vertex"], e["subtask_index"], e["blob_id"] is None) for e in manifest["entries"]} == {
        ("agg", 0, False), ("agg", 1, True)
    }


async def test_a_reference_to_another_jobs_prefix_is_refused_with_403_and_never_looked_up(store_api):
    api = store_api
    other = await api.job()
    _, theirs = await complete_written(api, other, "theirs")
    job = await api.job(incremental_channel_state=True)
    await api.trigger(job["id"])
    target = await target_of(api, job["id"], 1)
    key = await write_object(target, "agg-0-a1.state", b"opnew")
    their_key = theirs[("agg", 0)][0]
    parts = [{"key": their_key, "offset": 0, "length": 3}, {"offset": 0, "length": 3}]
    r = await api.ack(job["id"], 1, "agg", 0, written=written(key, b"op", b"new"),
                      channel_segments=[_input_segment(0, parts)])
    assert r.status_code == 403, r.text
    assert their_key in r.json()["error"]["message"] and f"not under job {job['id']}'s prefix" in r.text
    assert await rows(api, AckRow, job_id=job["id"]) == 0 and await rows(api, ChannelStateRefRow) == 0


async def test_a_reference_to_an_object_the_coordinator_never_recorded_is_422_naming_it_and_records_nothing(store_api):
    api = store_api
    job = await api.job(incremental_channel_state=True, retained=2)
    first, _ = await complete_written(api, job, "one")
    stray = await write_object(await target_of(api, job["id"], first), "agg-0-a1-stray.state", b"never acked")
    await api.trigger(job["id"])
    target = await target_of(api, job["id"], 2)
    key = await write_object(target, "agg-0-a1.state", b"opnew")
    for missing in (stray, checkpoint_prefix(job["id"], first) + "nothing-here.state"):
        parts = [{"key": missing, "offset": 0, "length": 3}, {"offset": 0, "length": 3}]
        r = await api.ack(job["id"], 2, "agg", 0, written=written(key, b"op", b"new"),
                          channel_segments=[_input_segment(0, parts)])
        assert r.status_code == 422, r.text
        assert missing in r.json()["error"]["message"] and "nothing was recorded" in r.text
    assert (await api.checkpoint(job["id"], 2))["num_acknowledged_subtasks"] == 0
    assert await rows(api, AckRow, job_id=job["id"], checkpoint_id=2) == 0
    assert await rows(api, BlobRow, job_id=job["id"], checkpoint_id=2) == 0
    assert await rows(api, ChannelStateRefRow) == 0


async def test_a_reference_to_an_uploaded_blob_no_ack_of_its_checkpoint_names_is_422_and_records_nothing(store_api):
    """Such a blob is collected with its checkpoint's unacked objects once that checkpoint's late writes are over:
    a reference to it would leave the referencing checkpoint unrestorable then."""
    api = store_api
    job = await api.job(incremental_channel_state=True, retained=2)
    await api.trigger(job["id"])
    orphan = await api.upload(job["id"], 1, "agg", 0, b"uploaded, then acked without it", kind="channel")
    assert orphan.status_code == 201, orphan.text
    assert all(r.status_code == 200 for r in await api.ack_all(job, 1))
    assert (await api.checkpoint(job["id"], 1))["status"] == "COMPLETED"
    await api.trigger(job["id"])
    key = await write_object(await target_of(api, job["id"], 2), "agg-0-a1.state", b"opnew")
    orphan_key = checkpoint_prefix(job["id"], 1) + orphan.json()["blob_id"]
    parts = [{"key": orphan_key, "offset": 0, "length": 3}, {"offset": 0, "length": 3}]
    r = await api.ack(job["id"], 2, "agg", 0, written=written(key, b"op", b"new"),
                      channel_segments=[_input_segment(0, parts)])
    assert r.status_code == 422, r.text
    assert orphan_key in r.json()["error"]["message"] and "no ack of checkpoint 1 names" in r.text
    assert await rows(api, AckRow, job_id=job["id"], checkpoint_id=2) == 0
    assert await rows(api, ChannelStateRefRow) == 0


async def test_a_savepoint_whose_channel_state_references_earlier_objects_is_422_and_records_nothing(store_api):
    """A savepoint holds its state whole (its write target never takes references): it is never collected, so the
    checkpoints whose objects it referenced would be held, whole prefixes, for good."""
    api = store_api
    job = await api.job(incremental_channel_state=True, retained=1)
    _, earlier = await complete_written(api, job, "one")
    savepoint = (await api.client.post(f"/api/v1/jobs/{job['id']}/savepoints", json={})).json()["id"]
    key = await write_object(await target_of(api, job["id"], savepoint), "agg-0-a1.state", b"opnew")
    old_key, _, out, inp = earlier[("agg", 0)]
    parts = [{"key": old_key, "offset": len(out), "length": len(inp)}, {"offset": 0, "length": 3}]
    r = await api.ack(job["id"], savepoint, "agg", 0, written=written(key, b"op", b"new"),
                      channel_segments=[_input_segment(0, parts)])
    assert r.status_code == 422, r.text
    assert "savepoint" in r.json()["error"]["message"] and old_key in r.json()["error"]["message"]
    assert await rows(api, AckRow, job_id=job["id"], checkpoint_id=savepoint) == 0
    assert await rows(api, ChannelStateRefRow) == 0


async def test_a_reference_past_the_end_of_the_referenced_channel_state_or_to_a_later_checkpoint_is_422(store_api):
    api = store_api
    job = await api.job(incremental_channel_state=True, retained=2)
    first, earlier = await complete_written(api, job, "one")
    await api.trigger(job["id"])
    target = await target_of(api, job["id"], 2)
    key = await write_object(target, "agg-0-a1.state", b"opnew")
    old_key, _, out, inp = earlier[("agg", 0)]
    for ref, phrase in (
        ({"key": old_key, "offset": len(out), "length": len(inp) + 1}, "which has"),
        ({"key": key, "offset": 0, "length": 3}, "not under an earlier checkpoint's prefix"),
    ):
        parts = [ref, {"offset": 0, "length": 3}]
        r = await api.ack(job["id"], 2, "agg", 0, written=written(key, b"op", b"new"),
                          channel_segments=[_input_segment(0, parts)])
        assert r.status_code == 422 and phrase in r.json()["error"]["message"], r.text
    assert await rows(api, ChannelStateRefRow) == 0


async def test_retention_keeps_a_referenced_prefix_and_deletes_it_once_nothing_retained_references_it(store_api):
    api = store_api
    job = await api.job(retained=1, incremental_channel_state=True)
    first, earlier = await complete_written(api, job, "one")
    second, _ = await complete_referencing(api, job, earlier, "two")
    # the first is discarded under retention=1, but the second references its objects: its prefix stays
    assert (await api.checkpoint(job["id"], first))["discarded"] is True
    await api.ctx.sweep_state(now=2**62)
    assert {earlier[("agg", i)][0] for i in range(2)} <= await under(api, checkpoint_prefix(job["id"], first))
    async with api.ctx.tx(readonly=True) as s:
        assert (await s.get(CheckpointRow, (job["id"], first))).cleanup == "held"
    # a third that references nothing discards the second: nothing retained references the first any more
    third, _ = await complete_written(api, job, "three")

    async def both_gone():
        return not await under(api, checkpoint_prefix(job["id"], first)) and not await under(
            api, checkpoint_prefix(job["id"], second)
        )

    await api.wait_for(both_gone, what="the first two checkpoints' prefixes deleted")
    assert await rows(api, ChannelStateRefRow) == 0
    assert await rows(api, BlobRow, job_id=job["id"], checkpoint_id=first) == 0
    assert len(await under(api, checkpoint_prefix(job["id"], third))) == 4


async def test_an_abort_of_the_referencing_checkpoint_releases_its_references(store_api):
    api = store_api
    job = await api.job(retained=1, incremental_channel_state=True, tolerable_failures=5)
    first, earlier = await complete_written(api, job, "one")
    pending, _ = await complete_referencing(api, job, earlier, "two", complete=False)
    assert await rows(api, ChannelStateRefRow, checkpoint_id=pending) == 1
    r = await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/{pending}/declines",
        json={"attempt": 1, "vertex": "src", "subtask_index": 1, "reason": "no"},
    )
    assert r.json()["status"] == "ABORTED"
    assert await rows(api, ChannelStateRefRow) == 0
    # the first is only the latest completed now: the next completed checkpoint collects it
    await complete_written(api, job, "three")

    async def first_gone():
        return not await under(api, checkpoint_prefix(job["id"], first))

    await api.wait_for(first_gone, what="the first checkpoint's prefix deleted")


async def test_references_through_the_coordinator_upload_path_are_refused(store_api):
    api = store_api
    job = await api.job(incremental_channel_state=True, retained=2)
    _, earlier = await complete_written(api, job, "one")
    await api.trigger(job["id"])
    info = (await api.upload(job["id"], 2, "agg", 0, b"new", kind="channel")).json()
    parts = [{"key": earlier[("agg", 0)][0], "offset": 0, "length": 3}, {"offset": 0, "length": 3}]
    r = await api.ack(job["id"], 2, "agg", 0, channel_state={"blob_id": info["blob_id"], "sha256": info["sha256"],
                                                            "size": 3},
                      channel_segments=[_input_segment(0, parts)])
    assert r.status_code == 422 and "only state written straight into the blob store" in r.text, r.text
    assert await rows(api, ChannelStateRefRow) == 0
