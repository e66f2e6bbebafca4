"""Recovery you can watch: restored subtasks' recovery in the live view, per subtask and summed per vertex, and the
current attempt's recovery phases in the attempts view."""

from __future__ import annotations

SUBTASKS = (("src", 0), ("src", 1), ("agg", 0), ("agg", 1))


async def _report(api, job_id: int, attempt: int, vertex: str, index: int, timestamp: int, **metrics):
    r = await api.client.post(
        f"/api/v1/jobs/{job_id}/attempts/{attempt}/subtasks/{vertex}/{index}/metrics",
        json={"timestamp": timestamp, "metrics": metrics},
    )
    assert r.status_code == 204, r.text


def _recovery(restored: int, replayed: int, finished_at: int | None, loop_at: int = 1_000, restore_ms: int = 40):
    return {
        "restored_checkpoint_id": 3, "restored_bytes": restored, "restored_buffers": restored // 100,
        "replayed_bytes": replayed, "replay_finished_at": finished_at, "restore_ms": restore_ms,
        "started_at": loop_at - restore_ms - 5, "loop_started_at": loop_at,
    }


async def _attempts(api, job_id: int) -> list[dict]:
    r = await api.client.get(f"/api/v1/jobs/{job_id}/attempts")
    assert r.status_code == 200, r.text
    return r.json()["items"]


async def test_the_live_view_shows_each_subtasks_recovery_and_sums_the_replay_per_vertex(sqlite_api):
    api = sqlite_api
    job = await api.job()
    await _report(api, job["id"], 1, "agg", 0, 1, recovery=_recovery(5_000, 1_200, None))
    await _report(api, job["id"], 1, "agg", 1, 1, recovery=_recovery(300, 300, 1_500))
    await _report(api, job["id"], 1, "src", 0, 1, records_in_per_second=1.0)
    view = (await api.client.get(f"/api/v1/jobs/{job['id']}/metrics")).json()
    by_vertex = {v["vertex"]: v for v in view["vertices"]}
    agg, src = by_vertex["agg"], by_vertex["src"]
    assert agg["subtasks"][0]["metrics"]["recovery"] == _recovery(5_000, 1_200, None)
    assert (agg["replaying"], agg["restored_bytes"], agg["replayed_bytes"]) == (1, 5_300, 1_500)
    assert (src["replaying"], src["restored_bytes"], src["replayed_bytes"]) == (0, None, None)
    assert src["subtasks"][0]["metrics"]["recovery"] is None


async def test_a_recovery_out_of_bounds_is_refused(sqlite_api):
    api = sqlite_api
    job = await api.job()
    for bad in ({"replayed_bytes": -1}, {"restored_checkpoint_id": 0}, {"replay_finished_at": 2**60}):
        r = await api.client.post(
            f"/api/v1/jobs/{job['id']}/attempts/1/subtasks/src/0/metrics",
            json={"timestamp": 1, "metrics": {"recovery": bad}},
        )
        assert r.status_code == 422, (bad, r.text)


async def test_the_current_attempt_shows_its_recovery_phases_from_its_subtasks_reports(sqlite_api):
    api = sqlite_api
    job = await api.job()
    await _report(api, job["id"], 1, "src", 0, 1, records_in_per_second=1.0)
    last_report = (await api.client.get(f"/api/v1/jobs/{job['id']}/metrics")).json()["vertices"][0]["subtasks"][0][
        "received_at"
    ]
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={"reason": "restart after a failure"})
    assert r.status_code == 201, r.text
    start = r.json()["started_at"]

    # three subtasks finished replaying, one still replays
    loops = {("src", 0): start + 900, ("src", 1): start + 700, ("agg", 0): start + 800, ("agg", 1): start + 750}
    restore = {("src", 0): 30, ("src", 1): 20, ("agg", 0): 120, ("agg", 1): 60}
    for key in SUBTASKS:
        finished = None if key == ("agg", 0) else loops[key] + 100
        rec = _recovery(1_000, 1_000 if finished else 400, finished, loops[key], restore[key])
        await _report(api, job["id"], 2, *key, 1, recovery=rec)
    current, first = await _attempts(api, job["id"])
    assert first["phases"] is None, "only the current attempt's phases are known"
    phases = current["phases"]
    assert phases["detect_ms"] == start - last_report
    assert phases["relaunch_ms"] == 700 and phases["restore_ms"] == 120
    assert phases["replaying"] == 1
    assert phases["replay_ms"] is None and phases["replay_finished_at"] is None, "one subtask still replays"

    await _report(api, job["id"], 2, "agg", 0, 2, recovery=_recovery(1_000, 1_000, start + 2_000, start + 800, 120))
    phases = (await _attempts(api, job["id"]))[0]["phases"]
    assert phases["replaying"] == 0
    assert phases["replay_finished_at"] == start + 2_000
    assert phases["replay_ms"] == 2_000 - 700


async def test_an_attempt_nobody_reported_for_has_no_phases(sqlite_api):
    api = sqlite_api
    job = await api.job()
    assert (await _attempts(api, job["id"]))[0]["phases"] is None
