"""Restore plans: latest or named checkpoint, per-subtask state and ordered channel-state segments,
source offsets; verified blobs with fallback to the previous completed checkpoint."""

from __future__ import annotations

from app.blobstore import upload_key


async def _complete_with_state(api, job, tag: str, savepoint=False) -> tuple[int, dict]:
    if savepoint:
        cp = (await api.client.post(f"/api/v1/jobs/{job['id']}/savepoints", json={})).json()["id"]
    else:
        cp = (await api.trigger(job["id"])).json()["id"]
    blobs = {}
    for v, p in (("src", 2), ("agg", 2)):
        for i in range(p):
            extra = {}
            if v == "src":
                extra["source_offsets"] = {f"partition-{i}": cp * 100 + i}
            else:
                op = (await api.upload(job["id"], cp, v, i, f"{tag}-op-{i}".encode(), kind="operator")).json()
                ch_data = f"{tag}-out-{i}".encode() + f"{tag}-in-{i}".encode()
                ch = (await api.upload(job["id"], cp, v, i, ch_data, kind="channel")).json()
                n_out = len(f"{tag}-out-{i}")
                extra["operator_state"] = {k: op[k] for k in ("blob_id", "sha256", "size")}
                extra["channel_state"] = {k: ch[k] for k in ("blob_id", "sha256", "size")}
                extra["channel_segments"] = [
                    {
                        "channel": f"in:src[1]->agg[{i}]",
                        "direction": "input",
                        "offset": n_out,
                        "length": len(ch_data) - n_out,
                        "buffer_count": 1,
                        "record_count": 1,
                        "partitioning": "hash",
                    },
                    {
                        "channel": f"out:agg[{i}]->sink",
                        "direction": "output",
                        "offset": 0,
                        "length": n_out,
                        "buffer_count": 1,
                        "record_count": 1,
                    },
                ]
                extra["key_group_start"], extra["key_group_end"] = (0, 7) if i == 0 else (8, 15)
                blobs[i] = (op, ch)
            r = await api.ack(job["id"], cp, v, i, **extra)
            assert r.status_code == 200, r.text
    return cp, blobs


async def test_plan_of_the_latest_checkpoint_has_state_segments_in_order_and_offsets(api):
    job = await api.job(retained=3)
    await _complete_with_state(api, job, "one")
    cp, blobs = await _complete_with_state(api, job, "two")
    plan = (await api.client.get(f"/api/v1/jobs/{job['id']}/restore-plan")).json()
    assert plan["checkpoint_id"] == cp and plan["fallbacks"] == []
    subs = {(s["vertex"], s["subtask_index"]): s for s in plan["subtasks"]}
    assert subs[("src", 1)]["source_offsets"] == {"partition-1": cp * 100 + 1}
    agg0 = subs[("agg", 0)]
    assert [s["blob_id"] for s in agg0["operator_state"]] == [blobs[0][0]["blob_id"]]
    assert agg0["operator_state"][0]["sha256"] == blobs[0][0]["sha256"]
    assert [s["direction"] for s in agg0["output_channel_state"]] == ["output"]
    assert [s["channel"] for s in agg0["input_channel_state"]] == ["in:src[1]->agg[0]"]
    seg = agg0["input_channel_state"][0]
    data = await api.client.get(
        f"/api/v1/jobs/{job['id']}/blobs/{seg['blob_id']}",
        headers={"Range": f"bytes={seg['offset']}-{seg['offset'] + seg['length'] - 1}"},
    )
    assert data.content == b"two-in-0"


async def test_new_attempt_restores_the_named_checkpoint(api):
    job = await api.job(retained=3)
    first, _ = await _complete_with_state(api, job, "one")
    await _complete_with_state(api, job, "two")
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={"restore_from_checkpoint": first})
    assert r.status_code == 201
    assert r.json()["restore_plan"]["checkpoint_id"] == first
    fresh = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={"restore_latest": False})
    assert fresh.json()["restore_plan"]["checkpoint_id"] is None


async def test_a_blob_cut_short_makes_the_plan_fall_back_and_say_why(api):
    job = await api.job(retained=3)
    older, _ = await _complete_with_state(api, job, "one")
    newer, blobs = await _complete_with_state(api, job, "two")
    path = api.ctx.store._path(upload_key(job["id"], newer, blobs[1][1]["blob_id"]))
    path.write_bytes(b"cut short")
    plan = (await api.client.get(f"/api/v1/jobs/{job['id']}/restore-plan")).json()
    assert plan["checkpoint_id"] == older
    assert plan["fallbacks"][0]["checkpoint_id"] == newer
    reason = plan["fallbacks"][0]["reason"]
    assert blobs[1][1]["blob_id"] in reason and "agg[1]" in reason and "cut" in reason


async def test_with_sha256_verification_flipped_bits_make_the_plan_fall_back(make_api):
    async with make_api(verify_blobs_on_restore="sha256") as api:
        job = await api.job(retained=3)
        older, _ = await _complete_with_state(api, job, "one")
        newer, blobs = await _complete_with_state(api, job, "two")
        path = api.ctx.store._path(upload_key(job["id"], newer, blobs[1][1]["blob_id"]))
        path.write_bytes(bytes(b ^ 1 for b in path.read_bytes()))  # same size, other bytes
        plan = (await api.client.get(f"/api/v1/jobs/{job['id']}/restore-plan")).json()
        assert plan["checkpoint_id"] == older
        assert plan["fallbacks"][0]["checkpoint_id"] == newer
        assert "corrupt" in plan["fallbacks"][0]["reason"] and "agg[1]" in plan["fallbacks"][0]["reason"]


async def test_stat_verification_reads_no_bytes_so_flipped_bits_are_left_to_the_subtask(api):
    job = await api.job(retained=3)
    await _complete_with_state(api, job, "one")
    newer, blobs = await _complete_with_state(api, job, "two")
    path = api.ctx.store._path(upload_key(job["id"], newer, blobs[1][1]["blob_id"]))
    path.write_bytes(bytes(b ^ 1 for b in path.read_bytes()))
    plan = (await api.client.get(f"/api/v1/jobs/{job['id']}/restore-plan")).json()
    assert plan["checkpoint_id"] == newer and plan["fallbacks"] == []  # the subtask's read finds it and reports it


async def test_a_missing_blob_makes_the_plan_fall_back(api):
    job = await api.job(retained=3)
    older, _ = await _complete_with_state(api, job, "one")
    newer, blobs = await _complete_with_state(api, job, "two")
    api.ctx.store._path(upload_key(job["id"], newer, blobs[0][0]["blob_id"])).unlink()
    attempt = (await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={})).json()
    assert attempt["restore_plan"]["checkpoint_id"] == older
    assert "missing" in attempt["restore_plan"]["fallbacks"][0]["reason"]
    events = await api.events(job["id"])
    assert events[-1]["type"] == "attempt.started" and events[-1]["data"]["restored_checkpoint_id"] == older


async def test_restoring_a_savepoint_after_retention_collected_its_neighbours(api):
    job = await api.job(retained=1)
    sp, _ = await _complete_with_state(api, job, "sp", savepoint=True)
    first, _ = await _complete_with_state(api, job, "one")
    await _complete_with_state(api, job, "two")
    r = await api.client.get(f"/api/v1/jobs/{job['id']}/restore-plan", params={"checkpoint_id": sp})
    assert r.status_code == 200 and r.json()["is_savepoint"] is True
    gone = await api.client.get(f"/api/v1/jobs/{job['id']}/restore-plan", params={"checkpoint_id": first})
    assert gone.status_code == 409 and "retention" in gone.json()["error"]["message"]


async def test_restore_refuses_unknown_and_aborted_checkpoints(api):
    job = await api.job(tolerable_failures=3)
    await api.trigger(job["id"])
    await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/1/declines",
        json={"attempt": 1, "vertex": "agg", "subtask_index": 1, "reason": "no"},
    )
    r = await api.client.get(f"/api/v1/jobs/{job['id']}/restore-plan", params={"checkpoint_id": 1})
    assert r.status_code == 409 and "ABORTED" in r.json()["error"]["message"]
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={"restore_from_checkpoint": 42})
    assert r.status_code == 404
    assert (await api.client.get(f"/api/v1/jobs/{job['id']}")).json()["current_attempt"] == 1


async def test_rescaling_splits_keyed_and_hash_input_state_by_key_group(api):
    job = await api.job(retained=3)
    # _complete_with_state marks its input segments with the hash partitioning of the src -> agg edge
    cp, blobs = await _complete_with_state(api, job, "one")
    r = await api.client.post(
        f"/api/v1/jobs/{job['id']}/attempts", json={"restore_from_checkpoint": cp, "parallelism": {"agg": 4}}
    )
    assert r.status_code == 201, r.text
    plan = r.json()["restore_plan"]
    agg = [s for s in plan["subtasks"] if s["vertex"] == "agg"]
    assert [(s["key_group_start"], s["key_group_end"]) for s in agg] == [(0, 3), (4, 7), (8, 11), (12, 15)]
    # old agg[0] owned key groups 0-7, old agg[1] 8-15: new agg[1] (4-7) reads old agg[0]'s keyed state for 4-7,
    # and old agg[1]'s non-keyed state (old subtask j goes to j mod 4), which holds none of its key groups
    slices = [(x["from_subtask"], x["key_group_start"], x["key_group_end"]) for x in agg[1]["operator_state"]]
    assert slices == [(0, 4, 7), (1, None, None)]
    slices = [(x["from_subtask"], x["key_group_start"], x["key_group_end"]) for x in agg[2]["operator_state"]]
    assert slices == [(1, 8, 11)]
    # input state of the hash edge: from the old subtasks whose key groups overlap, saying which those were
    for s, old in zip(agg, (0, 0, 1, 1), strict=True):
        segments = s["input_channel_state"]
        assert {seg["from_subtask"] for seg in segments} == {old}
        assert {(seg["key_group_start"], seg["key_group_end"]) for seg in segments} == {(0, 7) if old == 0 else (8, 15)}
    assert plan["rescaled"] == [
        {"vertex": "agg", "old_parallelism": 2, "new_parallelism": 4, "channel_state_bytes": plan["rescaled"][0]["channel_state_bytes"]}
    ]
    assert plan["rescaled"][0]["channel_state_bytes"] > 0
    job_now = (await api.client.get(f"/api/v1/jobs/{job['id']}")).json()
    assert {v["id"]: v["parallelism"] for v in job_now["graph"]["vertices"]} == {"src": 2, "agg": 4}
    new_cp = (await api.trigger(job["id"])).json()
    assert new_cp["num_subtasks"] == 6
    assert (await api.ack(job["id"], new_cp["id"], "agg", 3, attempt=2)).status_code == 200


async def test_rescaling_refuses_impossible_parallelism(api):
    job = await api.job()
    for parallelism, phrase in (
        ({"agg": 0}, "parallelism 1 to 16"),
        ({"agg": 17}, "parallelism 1 to 16"),
        ({"nope": 2}, "unknown vertex 'nope'"),
    ):
        r = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={"parallelism": parallelism})
        assert r.status_code == 422 and phrase in r.json()["error"]["message"], r.text
    assert (await api.client.get(f"/api/v1/jobs/{job['id']}")).json()["current_attempt"] == 1


async def test_a_restore_plan_looks_at_each_old_subtask_a_bounded_number_of_times(sqlite_api, monkeypatch):
    """Each new subtask finds the old subtasks it restores from without scanning all of them: the key-group ranges
    the plan computes grow with the number of subtasks, not with its square (a plan for 2,000 subtasks took
    seconds), restoring at the same parallelism and rescaled."""
    from app.domain import restore

    api = sqlite_api
    p = 120
    job = await api.job(parallelism={"src": p, "agg": p})
    cp = (await api.trigger(job["id"])).json()["id"]
    for v in ("src", "agg"):
        for first in range(0, p, 50):
            acks = [{"attempt": 1, "vertex": v, "subtask_index": i} for i in range(first, min(p, first + 50))]
            r = await api.client.post(f"/api/v1/jobs/{job['id']}/checkpoints/{cp}/acks/batch", json={"acks": acks})
            assert r.status_code == 200 and all(item["ok"] for item in r.json()["items"]), r.text
    assert (await api.checkpoint(job["id"], cp))["status"] == "COMPLETED"

    calls = []
    real = restore.key_group_range
    monkeypatch.setattr(restore, "key_group_range", lambda *a: calls.append(a) or real(*a))
    r = await api.client.get(f"/api/v1/jobs/{job['id']}/restore-plan")
    assert r.status_code == 200 and len(r.json()["subtasks"]) == 2 * p
    assert len(calls) <= 3 * 2 * p, len(calls)

    calls.clear()
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={"parallelism": {"agg": p // 3}})
    assert r.status_code == 201, r.text
    assert r.json()["restore_plan"]["rescaled"][0]["new_parallelism"] == p // 3
    assert len(calls) <= 3 * 2 * p, len(calls)


async def _complete(api, job, attempt: int) -> int:
    cp = (await api.trigger(job["id"])).json()["id"]
    for r in await api.ack_all(job, cp, attempt):
        assert r.status_code == 200, r.text
    return cp


async def test_an_attempt_after_another_restores_its_newest_checkpoint_chosen_as_it_opens(api):
    job = await api.job(retained=1)
    await _complete(api, job, 1)
    newest = await _complete(api, job, 1)  # retained=1 collected the first one as this completed
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={"restore_after_attempt": 1})
    assert r.status_code == 201, r.text
    plan = r.json()["restore_plan"]
    assert (plan["checkpoint_id"], plan["requested_checkpoint"]) == (newest, newest)
    attempts = (await api.client.get(f"/api/v1/jobs/{job['id']}/attempts")).json()["items"]
    assert attempts[0]["attempt"] == 2 and attempts[0]["restored_checkpoint_id"] == newest


async def test_an_attempt_that_completed_nothing_is_continued_from_what_it_restored_not_a_newer_checkpoint(api):
    job = await api.job(retained=3)
    older = await _complete(api, job, 1)
    await _complete(api, job, 1)
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={"restore_from_checkpoint": older})
    assert r.json()["attempt"] == 2
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={"restore_after_attempt": 2})
    assert r.status_code == 201, r.text
    assert r.json()["restore_plan"]["checkpoint_id"] == older


async def test_only_the_current_attempt_can_be_continued_where_it_left_off(api):
    job = await api.job(retained=3)
    await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={})
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={"restore_after_attempt": 1})
    assert r.status_code == 409, r.text
    assert "is on attempt 2, not 1" in r.text


async def test_an_attempts_reason_is_in_the_attempts_api(api):
    job = await api.job(retained=3)
    reason = "restart 1 after: executor 0 on 10.0.0.7:40213 lost (worker lost)"
    await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={"reason": reason})
    attempts = (await api.client.get(f"/api/v1/jobs/{job['id']}/attempts")).json()["items"]
    assert [a["reason"] for a in attempts] == [reason, None]


async def test_a_checkpoint_completed_late_by_the_failed_attempt_cannot_make_the_restart_restore_a_collected_one(api):
    """retained=1: a restart that named the newest checkpoint it had read was refused once a killed task's late ack
    completed a newer one (retention collected the named one); where the attempt left off is chosen as it opens."""
    job = await api.job(retained=1)
    read = await _complete(api, job, 1)  # what a restart reading the checkpoints would have chosen
    late = await _complete(api, job, 1)  # a task of the stopped stage acknowledged meanwhile
    named = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={"restore_from_checkpoint": read})
    assert named.status_code == 409 and "collected under the retention policy" in named.text
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={"restore_after_attempt": 1})
    assert r.status_code == 201, r.text
    assert r.json()["restore_plan"]["checkpoint_id"] == late
