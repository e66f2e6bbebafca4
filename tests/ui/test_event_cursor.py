"""The event cursor: where a job's event log stands, so the UI follows only new events."""

from __future__ import annotations

import httpx


def test_event_cursor_names_the_newest_event_and_the_stream_continues_after_it(seeded):
    base = f"{seeded.url}/api/v1/jobs/{seeded.orders}"
    cursor = httpx.get(f"{base}/events/cursor").json()
    events = httpx.get(f"{base}/events/history", params={"after": 0, "limit": 10_000}).json()
    assert cursor == {"job_id": seeded.orders, "latest_event_id": events[-1]["id"]}
    assert httpx.get(f"{base}/events/history", params={"after": cursor["latest_event_id"]}).json() == []


def test_event_cursor_of_an_unknown_job_is_404(coordinator):
    r = httpx.get(f"{coordinator.url}/api/v1/jobs/987654/events/cursor")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
