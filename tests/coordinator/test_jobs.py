"""Registering jobs, refusing invalid graphs and configs, attempts, cancel and finish."""

from __future__ import annotations

import pytest

V = {"id": "a", "parallelism": 2}


def job_body(vertices=None, edges=None, **checkpoint):
    return {
        "name": "orders",
        "graph": {"vertices": vertices or [V, {"id": "b", "parallelism": 2}], "edges": edges or []},
        "checkpoint": checkpoint,
    }


async def test_register_job_returns_it_with_its_graph_and_config(api):
    r = await api.client.post(
        "/api/v1/jobs",
        json=job_body(
            edges=[{"source": "a", "target": "b", "partitioning": "forward"}],
            interval=1000,
            policy="unaligned",
        ),
    )
    assert r.status_code == 201
    job = r.json()
    assert job["status"] == "CREATED" and job["current_attempt"] is None
    assert job["checkpoint"]["interval"] == 1000 and job["checkpoint"]["policy"] == "unaligned"
    assert [v["id"] for v in job["graph"]["vertices"]] == ["a", "b"]
    got = await api.client.get(f"/api/v1/jobs/{job['id']}")
    assert got.json()["name"] == "orders"


@pytest.mark.parametrize(
    "body, phrase",
    [
        (job_body(edges=[{"source": "a", "target": "zzz"}]), "unknown vertex 'zzz'"),
        (
            job_body(
                edges=[
                    {"source": "a", "target": "b", "partitioning": "hash"},
                    {"source": "b", "target": "a", "partitioning": "hash"},
                ]
            ),
            "cycle",
        ),
        (job_body(vertices=[{"id": "a", "parallelism": 0}]), "parallelism 0"),
        (
            job_body(
                vertices=[V, {"id": "b", "parallelism": 3}],
                edges=[{"source": "a", "target": "b", "partitioning": "forward"}],
            ),
            "forward needs equal parallelism",
        ),
        (job_body(vertices=[{"id": "a", "parallelism": 8, "max_parallelism": 4}]), "max_parallelism 4 below"),
        (job_body(timeout=0), "timeout must be positive"),
        (job_body(timeout=-5), "timeout must be positive"),
        (job_body(interval=0), "interval must be positive"),
        (job_body(max_concurrent=0), "max_concurrent must be at least 1"),
        (job_body(retained=0), "retained must be at least 1"),
        (job_body(min_pause=-1), "min_pause must not be negative"),
        (job_body(policy="aligned", alignment_timeout=100), "applies only to policy aligned_then_unaligned"),
        (
            job_body(policy="aligned_then_unaligned", alignment_timeout=5000, timeout=1000),
            "must be below checkpoint.timeout",
        ),
        (job_body(policy="aligned", max_inflight_bytes_per_subtask=1024), "policy aligned persists none"),
        (
            job_body(policy="unaligned_last_barrier", max_inflight_bytes=4096),
            "policy unaligned_last_barrier decides nothing before its last barrier",
        ),
        (job_body(policy="unaligned", max_inflight_bytes=-1), "max_inflight_bytes must not be negative"),
        (job_body(policy="unaligned", over_inflight_budget="spill"), "checkpoint.over_inflight_budget"),
        (job_body(vertices=[V, V]), "appears twice"),
        (job_body(policy="sometimes"), "checkpoint.policy"),
        ({**job_body(), "name": "bad name/../x"}, "job name"),
        ({**job_body(), "graph": {"vertices": []}}, "graph.vertices"),
        (job_body(vertices=[{"id": "a/b", "parallelism": 1}]), "vertex id 'a/b'"),
    ],
)
async def test_invalid_job_is_refused_with_422_naming_the_problem_and_nothing_is_stored(api, body, phrase):
    r = await api.client.post("/api/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid"
    assert phrase in err["message"]
    assert (await api.client.get("/api/v1/jobs")).json()["total"] == 0


async def test_malformed_json_is_a_422_not_a_500(api):
    r = await api.client.post(
        "/api/v1/jobs", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 422
    assert r.json()["error"]["code"] == "invalid"


async def test_starting_an_attempt_returns_number_token_and_fresh_plan(api):
    job = await api.job(start=False)
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={})
    assert r.status_code == 201
    attempt = r.json()
    assert attempt["attempt"] == 1
    assert attempt["task_token"].startswith("ovt_")
    assert attempt["restore_plan"]["checkpoint_id"] is None
    assert len(attempt["restore_plan"]["subtasks"]) == 4
    assert (await api.client.get(f"/api/v1/jobs/{job['id']}")).json()["status"] == "RUNNING"


async def test_an_attempt_says_why_it_started_on_the_job_and_in_its_event(api):
    job = await api.job()
    why = "restart 1 after: job 1 attempt 1: the Spark barrier stage failed: executor lost"
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={"reason": why})
    assert r.status_code == 201, r.text
    assert (await api.client.get(f"/api/v1/jobs/{job['id']}")).json()["status_message"] == why
    events = (await api.client.get(f"/api/v1/jobs/{job['id']}/events/history")).json()
    started = [e["data"] for e in events if e["type"] == "attempt.started"]
    assert started[-1]["attempt"] == 2 and started[-1]["reason"] == why
    too_long = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={"reason": "x" * 2001})
    assert too_long.status_code == 422


async def test_a_new_attempt_aborts_pending_checkpoints_of_the_older_one(api):
    job = await api.job()
    cp = (await api.trigger(job["id"])).json()
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={})
    assert r.json()["attempt"] == 2
    old = await api.checkpoint(job["id"], cp["id"])
    assert old["status"] == "ABORTED"
    assert old["failure_reason"].startswith("new_attempt")
    # a late ack from the old attempt is refused and says why
    late = await api.ack(job["id"], cp["id"], "src", 0, attempt=1)
    assert late.status_code == 409
    assert "aborted" in late.json()["error"]["message"]


async def test_jobs_are_listed_newest_first_and_filtered_by_status(api):
    first = await api.job(start=False)
    second = await api.job()
    page = (await api.client.get("/api/v1/jobs")).json()
    assert [j["id"] for j in page["items"]] == [second["id"], first["id"]]
    running = (await api.client.get("/api/v1/jobs", params={"status": "RUNNING"})).json()
    assert [j["id"] for j in running["items"]] == [second["id"]]


async def test_jobs_are_filtered_by_a_label_with_any_key(api):
    labelled = [{"team": "a"}, {"team": "b"}, {'we"ird.key': "x y", "team": "a"}, {"team": ""}, {}]
    ids = []
    for labels in labelled:
        r = await api.client.post("/api/v1/jobs", json={**job_body(), "labels": labels})
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])

    async def listed(label: str, **params) -> tuple[list[int], int]:
        page = (await api.client.get("/api/v1/jobs", params={"label": label, **params})).json()
        return [j["id"] for j in page["items"]], page["total"]

    assert await listed("team=a") == ([ids[2], ids[0]], 2)
    assert await listed("team=a", limit=1, offset=1) == ([ids[0]], 2)
    assert await listed('we"ird.key=x y') == ([ids[2]], 1)
    assert await listed("team=") == ([ids[3]], 1)
    assert await listed("team=a", status="FAILED") == ([], 0)
    assert await listed("nobody=a") == ([], 0)


async def test_listing_jobs_by_label_loads_only_the_page(api):
    """The label filter ran in Python over every job (with its graph): a page of jobs by label read them all."""
    from sqlalchemy import event

    from app.db.models import JobRow

    for _ in range(8):
        r = await api.client.post("/api/v1/jobs", json={**job_body(), "labels": {"team": "a"}})
        assert r.status_code == 201, r.text
    loaded = []

    def load(target, context):
        loaded.append(target.id)

    event.listen(JobRow, "load", load)
    try:
        page = (await api.client.get("/api/v1/jobs", params={"label": "team=a", "limit": 2})).json()
    finally:
        event.remove(JobRow, "load", load)
    assert page["total"] == 8 and len(page["items"]) == 2
    assert sorted(loaded) == sorted(j["id"] for j in page["items"])


async def test_cancel_aborts_pending_checkpoints_and_refuses_new_triggers(api):
    job = await api.job()
    cp = (await api.trigger(job["id"])).json()
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "CANCELLED"
    assert (await api.checkpoint(job["id"], cp["id"]))["failure_reason"].startswith("job_cancelled")
    again = await api.trigger(job["id"])
    assert again.status_code == 409 and "CANCELLED" in again.json()["error"]["message"]
    twice = await api.client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert twice.status_code == 409
    events = [e["type"] for e in await api.events(job["id"])]
    assert events[-1] == "job.status"


async def test_finish_marks_the_job_failed_with_its_message(api):
    job = await api.job()
    r = await api.client.post(
        f"/api/v1/jobs/{job['id']}/finish", json={"status": "FAILED", "message": "boom"}
    )
    assert r.status_code == 200
    assert r.json()["status"] == "FAILED" and r.json()["status_message"] == "boom"


async def test_unknown_job_is_404_everywhere(api):
    for method, path in [
        ("get", "/api/v1/jobs/999"),
        ("post", "/api/v1/jobs/999/attempts"),
        ("post", "/api/v1/jobs/999/checkpoints"),
        ("get", "/api/v1/jobs/999/checkpoints"),
        ("get", "/api/v1/jobs/999/restore-plan"),
        ("get", "/api/v1/jobs/999/events/history"),
    ]:
        r = await getattr(api.client, method)(path)
        assert r.status_code == 404, (path, r.text)
        assert "job 999" in r.json()["error"]["message"]


async def test_each_attempt_says_why_it_ended(api):
    job = await api.job()
    cause = "restart 1 after: SparkException: Job aborted due to stage failure"
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={"reason": cause})
    assert r.status_code == 201, r.text
    page = (await api.client.get(f"/api/v1/jobs/{job['id']}/attempts")).json()
    by = {a["attempt"]: a for a in page["items"]}
    assert by[1]["end_reason"] == cause and by[2]["reason"] == cause and by[2]["end_reason"] is None
    await api.client.post(f"/api/v1/jobs/{job['id']}/finish", json={"status": "FINISHED", "message": "input done"})
    page = (await api.client.get(f"/api/v1/jobs/{job['id']}/attempts")).json()
    assert {a["attempt"]: a for a in page["items"]}[2]["end_reason"] == "the job ended as FINISHED: input done"
