"""What the coordinator says about a checkpoint is what happened: its type is what the coordinator decided, what
each subtask did is counted beside it, and each subtask's ack time is its own, also when a host's relay sends the
acks of several subtasks in one request."""

from __future__ import annotations

import time

from tests.coordinator.test_adaptive import _report


async def _ack_batch(api, job_id: int, cp: int, acks: list[dict]):
    r = await api.client.post(f"/api/v1/jobs/{job_id}/checkpoints/{cp}/acks/batch", json={"acks": acks})
    assert r.status_code == 200 and all(i["ok"] for i in r.json()["items"]), r.text
    return r.json()


async def test_an_unaligned_checkpoint_stays_unaligned_while_pending_and_counts_what_its_subtasks_did(api):
    job = await api.job(policy="unaligned")
    cp = (await api.trigger(job["id"])).json()
    assert cp["checkpoint_type"] == "unaligned"
    await api.ack(job["id"], cp["id"], "src", 0, metrics={"unaligned": True})
    await api.ack(job["id"], cp["id"], "src", 1, metrics={"unaligned": False})
    await api.ack(job["id"], cp["id"], "agg", 0, metrics={"unaligned": False, "aligned_over_budget": True})
    detail = await api.checkpoint(job["id"], cp["id"])
    assert detail["status"] == "PENDING" and detail["num_acknowledged_subtasks"] == 3
    assert detail["checkpoint_type"] == "unaligned"
    assert detail["subtask_modes"] == {"unaligned": 1, "aligned": 1, "aligned_over_budget": 1}
    by = {(s["vertex"], s["subtask_index"]): s for s in detail["subtasks"]}
    assert by[("agg", 0)]["aligned_over_budget"] is True and by[("src", 1)]["aligned_over_budget"] is False
    (agg,) = [v for v in detail["vertices"] if v["vertex"] == "agg"]
    assert agg["num_aligned_over_budget"] == 1 and agg["num_unaligned"] == 0
    # the last subtask acks in a relay's batch: the counts add up in the completing transaction as well
    await _ack_batch(api, job["id"], cp["id"], [{"attempt": 1, "vertex": "agg", "subtask_index": 1,
                                                 "metrics": {"aligned_over_budget": True}}])
    done = await api.checkpoint(job["id"], cp["id"])
    assert done["status"] == "COMPLETED" and done["checkpoint_type"] == "unaligned"
    assert done["subtask_modes"] == {"unaligned": 1, "aligned": 1, "aligned_over_budget": 2}
    page = (await api.client.get(f"/api/v1/jobs/{job['id']}/checkpoints")).json()
    assert page["items"][0]["subtask_modes"] == done["subtask_modes"]


async def test_an_adaptive_checkpoint_taken_unaligned_is_unaligned_before_any_ack(api):
    job = await api.job(policy="adaptive", alignment_timeout=400)
    await _report(api, job, 1.0)
    cp = (await api.trigger(job["id"])).json()
    assert cp["policy"] == "unaligned" and "backpressure" in cp["decision"]["reason"]
    assert cp["checkpoint_type"] == "unaligned"
    assert cp["subtask_modes"] == {"unaligned": 0, "aligned": 0, "aligned_over_budget": 0}
    stats = (await api.client.get(f"/api/v1/jobs/{job['id']}/checkpoints/stats")).json()
    assert stats["history"][0]["checkpoint_type"] == "unaligned"


async def test_an_aligned_checkpoint_is_aligned_whatever_an_ack_claims(api):
    job = await api.job(policy="aligned")
    cp = (await api.trigger(job["id"])).json()
    await api.ack_all(job, cp["id"], skip={("agg", 1)})
    await api.ack(job["id"], cp["id"], "agg", 1, metrics={"unaligned": True})
    detail = await api.checkpoint(job["id"], cp["id"])
    assert detail["checkpoint_type"] == "aligned"
    assert detail["subtask_modes"] == {"unaligned": 1, "aligned": 3, "aligned_over_budget": 0}


async def test_relayed_acks_keep_each_subtasks_own_ack_time_bounded_by_trigger_and_arrival(api):
    job = await api.job(parallelism={"src": 4}, policy="unaligned")
    cp = (await api.trigger(job["id"])).json()
    trigger = cp["trigger_timestamp"]
    time.sleep(0.05)  # room between the trigger and the batch's arrival for times inside it
    sent = {0: trigger + 10, 1: trigger + 40, 2: trigger - 60_000, 3: trigger + 3_600_000}  # 2 and 3: skewed clocks
    acks = [{"attempt": 1, "vertex": "src", "subtask_index": i, "metrics": {"unaligned": True, "ack_timestamp": t}}
            for i, t in sent.items()]
    before = int(time.time() * 1000)
    await _ack_batch(api, job["id"], cp["id"], acks)
    after = int(time.time() * 1000)
    detail = await api.checkpoint(job["id"], cp["id"])
    by = {s["subtask_index"]: s for s in detail["subtasks"]}
    assert by[0]["ack_timestamp"] == trigger + 10 and by[0]["end_to_end_duration"] == 10
    assert by[1]["ack_timestamp"] == trigger + 40 and by[1]["end_to_end_duration"] == 40
    assert by[2]["ack_timestamp"] == trigger and by[2]["end_to_end_duration"] == 0  # not before the trigger
    assert before <= by[3]["ack_timestamp"] <= after  # not after it arrived
    (src,) = detail["vertices"]
    e2e = src["end_to_end_duration"]
    assert e2e["min"] == 0 and e2e["max"] == by[3]["end_to_end_duration"] and e2e["min"] < e2e["avg"] < e2e["max"]


async def test_an_ack_without_its_own_time_is_recorded_at_its_arrival(api):
    job = await api.job(parallelism={"src": 1})
    cp = (await api.trigger(job["id"])).json()
    before = int(time.time() * 1000)
    await api.ack(job["id"], cp["id"], "src", 0)
    (sub,) = (await api.checkpoint(job["id"], cp["id"]))["subtasks"]
    assert before <= sub["ack_timestamp"] <= int(time.time() * 1000)


async def test_a_checkpoint_keeps_its_longest_start_delay_beside_its_alignment(api):
    job = await api.job(policy="aligned")
    cp = (await api.trigger(job["id"])).json()
    delays = {("src", 0): 1700, ("src", 1): 20, ("agg", 0): 5}
    for (v, i), d in delays.items():
        await api.ack(job["id"], cp["id"], v, i, metrics={"start_delay": d, "alignment_duration": 0})
    await _ack_batch(api, job["id"], cp["id"], [{"attempt": 1, "vertex": "agg", "subtask_index": 1,
                                                 "metrics": {"start_delay": 30}}])
    detail = await api.checkpoint(job["id"], cp["id"])
    assert detail["status"] == "COMPLETED"
    assert detail["start_delay"] == 1700 and detail["alignment_duration"] == 0
    page = (await api.client.get(f"/api/v1/jobs/{job['id']}/checkpoints")).json()
    assert page["items"][0]["start_delay"] == 1700


async def test_an_expired_checkpoint_names_the_subtasks_that_never_acked(api):
    job = await api.job(timeout=1000, tolerable_failures=10)
    cp = (await api.trigger(job["id"])).json()
    skip = {("agg", 1), ("src", 0)}
    sent = [(v["id"], i) for v in job["graph"]["vertices"] for i in range(v["parallelism"]) if (v["id"], i) not in skip]
    answers = await api.ack_all(job, cp["id"], skip=skip)
    # an ack a loaded machine delivers after the expiry is refused, and that subtask never acked either
    accepted = {s for s, r in zip(sent, answers, strict=True) if r.status_code < 300}
    assert accepted, [r.text for r in answers]
    expected = [f"{v['id']}[{i}]" for v in job["graph"]["vertices"] for i in range(v["parallelism"])
                if (v["id"], i) not in accepted]

    async def aborted():
        c = await api.checkpoint(job["id"], cp["id"])
        return c if c["status"] == "ABORTED" else None

    c = await api.wait_for(aborted, what="expiry")
    assert c["abort_reason"] == "expired" and c["pending_subtasks"] == []
    assert c["never_acked_subtasks"] == expected
