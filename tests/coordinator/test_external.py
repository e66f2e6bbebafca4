"""Checkpoints reported by an engine (Structured Streaming micro-batches): ids are the engine's and only grow,
reports are idempotent, figures and offsets are kept, and a finished job can be resumed by a new attempt."""

from __future__ import annotations


def report(cp_id: int, t0: int = 1_000_000, **extra) -> dict:
    return {
        "id": cp_id,
        "trigger_timestamp": t0 + cp_id * 1000,
        "completed_timestamp": t0 + cp_id * 1000 + 250,
        "processed_data": 100 * cp_id,
        "state_size": 4096,
        "source_offsets": {"src": {"topic-0": cp_id * 10}},
        "metrics": {"durationMs": {"walCommit": 12, "commitOffsets": 7}, "numInputRows": 100 * cp_id},
        **extra,
    }


async def test_reported_micro_batches_become_completed_aligned_checkpoints(api):
    job = await api.job(parallelism={"src": 1, "agg": 1})
    for n in (0, 1, 2):
        r = await api.client.post(f"/api/v1/jobs/{job['id']}/checkpoints/external", json=report(n))
        assert r.status_code == 201, r.text
        cp = r.json()
        assert (cp["id"], cp["status"], cp["checkpoint_type"]) == (n, "COMPLETED", "aligned")
        assert cp["end_to_end_duration"] == 250 and cp["details"]["metrics"]["durationMs"]["walCommit"] == 12
    again = await api.client.post(f"/api/v1/jobs/{job['id']}/checkpoints/external", json=report(2))
    assert again.status_code == 200
    different = await api.client.post(f"/api/v1/jobs/{job['id']}/checkpoints/external", json=report(2, state_size=1))
    assert different.status_code == 409
    older = await api.client.post(f"/api/v1/jobs/{job['id']}/checkpoints/external", json=report(1, state_size=7))
    assert older.status_code == 409
    plan = (await api.client.get(f"/api/v1/jobs/{job['id']}/restore-plan")).json()
    assert plan["checkpoint_id"] == 2
    assert {s["vertex"]: s["source_offsets"] for s in plan["subtasks"]}["src"] == {"topic-0": 20}
    # a manual trigger continues after the reported ids
    assert (await api.trigger(job["id"])).json()["id"] == 3


async def test_a_report_with_times_out_of_order_is_422(api):
    job = await api.job()
    r = await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/external",
        json={"id": 1, "trigger_timestamp": 2000, "completed_timestamp": 1000},
    )
    assert r.status_code == 422 and "before trigger_timestamp" in r.json()["error"]["message"]


async def test_a_finished_job_resumes_with_a_new_attempt_and_continues_its_ids(api):
    job = await api.job()
    await api.client.post(f"/api/v1/jobs/{job['id']}/checkpoints/external", json=report(5))
    await api.client.post(f"/api/v1/jobs/{job['id']}/finish", json={"status": "FINISHED"})
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={})
    assert r.status_code == 201 and r.json()["restore_plan"]["checkpoint_id"] == 5
    assert (await api.client.post(f"/api/v1/jobs/{job['id']}/checkpoints/external", json=report(6))).status_code == 201
    await api.client.post(f"/api/v1/jobs/{job['id']}/cancel")
    refused = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={})
    assert refused.status_code == 409 and "cancelled" in refused.json()["error"]["message"]


async def test_jobs_can_be_found_by_label(api):
    body = {"name": "q", "graph": {"vertices": [{"id": "a", "parallelism": 1}]}, "labels": {"query_id": "abc"}}
    mine = (await api.client.post("/api/v1/jobs", json=body)).json()
    await api.client.post("/api/v1/jobs", json={**body, "labels": {"query_id": "other"}})
    page = (await api.client.get("/api/v1/jobs", params={"label": "query_id=abc"})).json()
    assert page["total"] == 1 and page["items"][0]["id"] == mine["id"]
    bad = await api.client.get("/api/v1/jobs", params={"label": "no-equals-sign"})
    assert bad.status_code == 422
