"""The adaptive policy through the coordinator: each checkpoint records what it chose and why, from the job's
finished checkpoints and the live backpressure its subtasks report; the barriers carry the chosen policy."""

from __future__ import annotations

import time


async def _ack_all(api, job, cp, **metrics):
    for v in job["graph"]["vertices"]:
        for i in range(v["parallelism"]):
            r = await api.ack(job["id"], cp, v["id"], i, metrics=metrics)
            assert r.status_code == 200, r.text


async def _report(api, job, backpressure):
    for v in job["graph"]["vertices"]:
        for i in range(v["parallelism"]):
            r = await api.client.post(
                f"/api/v1/jobs/{job['id']}/attempts/1/subtasks/{v['id']}/{i}/metrics",
                json={"timestamp": int(time.time() * 1000), "metrics": {"backpressure": backpressure}},
            )
            assert r.status_code == 204, r.text


async def test_adaptive_checkpoints_follow_backpressure_as_it_comes_and_goes_and_say_why(api):
    job = await api.job(policy="adaptive", alignment_timeout=400, max_concurrent=1)
    first = (await api.trigger(job["id"])).json()
    assert first["policy"] == "aligned_then_unaligned" and first["alignment_timeout"] == 400
    assert first["decision"]["requested"] == "adaptive" and "no finished checkpoint" in first["decision"]["reason"]
    await _ack_all(api, job, first["id"], alignment_duration=5)

    # backpressure arrives: the next checkpoint starts unaligned, and its trigger event says so
    await _report(api, job, 0.95)
    hot = (await api.trigger(job["id"])).json()
    assert hot["policy"] == "unaligned" and hot["alignment_timeout"] is None
    assert hot["decision"]["backpressure"] == 0.95 and hot["decision"]["based_on"] == first["id"]
    triggered = [e for e in await api.events(job["id"]) if e["type"] == "checkpoint.triggered"]
    assert triggered[-1]["data"]["policy"] == "unaligned"
    await _ack_all(api, job, hot["id"], unaligned=True, persisted_data=4 << 20)

    # backpressure eases but the last checkpoint still persisted megabytes: stay unaligned
    await _report(api, job, 0.1)
    still = (await api.trigger(job["id"])).json()
    assert still["policy"] == "unaligned" and "still full" in still["decision"]["reason"]
    await _ack_all(api, job, still["id"], unaligned=True, persisted_data=1000)

    # channels drained: align again
    calm = (await api.trigger(job["id"])).json()
    assert calm["policy"] == "aligned_then_unaligned" and "nearly empty" in calm["decision"]["reason"]
    listed = (await api.client.get(f"/api/v1/jobs/{job['id']}/checkpoints/{calm['id']}")).json()
    assert listed["decision"] == calm["decision"]


async def test_a_failed_adaptive_checkpoint_makes_the_next_one_unaligned(api):
    job = await api.job(policy="adaptive", tolerable_failures=5)
    await api.trigger(job["id"])
    r = await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/1/declines",
        json={"attempt": 1, "vertex": "agg", "subtask_index": 0, "reason": "alignment ran out"},
    )
    assert r.status_code == 200
    nxt = (await api.trigger(job["id"])).json()
    assert nxt["policy"] == "unaligned" and "checkpoint 1 failed (declined)" in nxt["decision"]["reason"]


async def test_a_fixed_policy_records_no_decision_and_a_trigger_may_ask_for_adaptive_once(api):
    job = await api.job(policy="aligned")
    fixed = (await api.trigger(job["id"])).json()
    assert fixed["policy"] == "aligned" and fixed["decision"] is None
    await _ack_all(api, job, fixed["id"])
    once = (await api.trigger(job["id"], policy="adaptive")).json()
    assert once["decision"]["requested"] == "adaptive" and once["policy"] == "aligned_then_unaligned"


async def test_alignment_timeout_is_accepted_for_adaptive_and_savepoints_stay_aligned(api):
    job = await api.job(policy="adaptive", alignment_timeout=100)
    sp = (await api.client.post(f"/api/v1/jobs/{job['id']}/savepoints", json={})).json()
    assert sp["policy"] == "aligned" and sp["decision"] is None
