"""Two coordinator processes on one PostgreSQL and one Redis: ids are never issued twice, a checkpoint completes
once under concurrent (and duplicated) acks on both, each periodic trigger fires once, events reach both."""

from __future__ import annotations

import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.live import LiveCoordinator

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def replicas(tmp_path, pg_url, redis_url):
    env = {
        "OVERTAKE_DATABASE_URL": pg_url,
        "OVERTAKE_REDIS_URL": redis_url,
        "OVERTAKE_BLOB_URL": (tmp_path / "shared-blobs").as_uri(),
    }
    a = LiveCoordinator(tmp_path / "a", env).start()
    b = LiveCoordinator(tmp_path / "b", env).start()
    yield a, b
    a.stop()
    b.stop()


def _job(url: str, parallelism: int, **checkpoint) -> dict:
    body = {
        "name": "replicated",
        "graph": {
            "vertices": [{"id": "src", "parallelism": parallelism, "max_parallelism": max(128, parallelism)}]
        },
        "checkpoint": checkpoint,
    }
    job = httpx.post(f"{url}/api/v1/jobs", json=body).raise_for_status().json()
    httpx.post(f"{url}/api/v1/jobs/{job['id']}/attempts", json={}).raise_for_status()
    return job


def test_concurrent_triggers_on_two_replicas_never_issue_the_same_id(replicas):
    a, b = replicas
    job = _job(a.url, 1, max_concurrent=1000)
    urls = [a.url, b.url] * 30

    def trigger(url):
        return httpx.post(f"{url}/api/v1/jobs/{job['id']}/checkpoints", json={}, timeout=30).json()["id"]

    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(trigger, urls))
    assert sorted(ids) == list(range(1, 61))


def test_concurrent_and_duplicated_acks_on_two_replicas_complete_the_checkpoint_once(replicas):
    a, b = replicas
    n = 200
    job = _job(a.url, n)
    cp = httpx.post(f"{a.url}/api/v1/jobs/{job['id']}/checkpoints", json={}).json()["id"]
    rng = random.Random(7)
    sends = [(rng.choice([a.url, b.url]), i) for i in range(n)]
    sends += [
        (rng.choice([a.url, b.url]), i) for i in rng.sample(range(n), 60)
    ]  # duplicates, maybe on the other replica
    rng.shuffle(sends)

    def ack(item):
        url, i = item
        body = {"attempt": 1, "vertex": "src", "subtask_index": i, "metrics": {"processed_data": i}}
        r = httpx.post(f"{url}/api/v1/jobs/{job['id']}/checkpoints/{cp}/acks", json=body, timeout=60)
        return r.status_code, r.json()

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(ack, sends))
    assert all(code == 200 for code, _ in results), [r for r in results if r[0] != 200][:3]
    assert sum(1 for _, body in results if body["duplicate"]) == 60
    detail = httpx.get(f"{b.url}/api/v1/jobs/{job['id']}/checkpoints/{cp}").json()
    assert detail["status"] == "COMPLETED" and detail["num_acknowledged_subtasks"] == n
    assert len(detail["subtasks"]) == n
    assert detail["processed_data"] == sum(range(n))
    events = httpx.get(f"{a.url}/api/v1/jobs/{job['id']}/events/history").json()
    assert [e["type"] for e in events].count("checkpoint.completed") == 1


def test_each_periodic_trigger_fires_once_across_replicas(replicas):
    a, b = replicas
    interval = 250
    job = _job(a.url, 1, interval=interval, max_concurrent=1000, timeout=60_000)
    deadline = time.monotonic() + 30
    triggered = []
    while time.monotonic() < deadline and len(triggered) < 8:
        events = httpx.get(f"{b.url}/api/v1/jobs/{job['id']}/events/history").json()
        triggered = [e for e in events if e["type"] == "checkpoint.triggered"]
        time.sleep(0.1)
    assert len(triggered) >= 8
    stamps = [e["data"]["trigger_timestamp"] for e in triggered]
    # Two replicas firing the same period would leave two triggers closer than the interval.
    gaps = [y - x for x, y in zip(stamps, stamps[1:], strict=False)]
    assert min(gaps) >= interval, gaps
    assert [e["data"]["checkpoint_id"] for e in triggered] == list(range(1, len(triggered) + 1))


def test_events_published_on_one_replica_reach_a_stream_on_the_other(replicas):
    a, b = replicas
    job = _job(a.url, 1, max_concurrent=10)
    received: list[dict] = []
    ready = threading.Event()

    def listen():
        with httpx.stream(
            "GET", f"{b.url}/api/v1/jobs/{job['id']}/events", params={"after": 1}, timeout=30
        ) as r:
            ready.set()
            for line in r.iter_lines():
                if line.startswith("data:"):
                    received.append(json.loads(line[5:]))
                    if len(received) >= 3:
                        return

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    ready.wait(10)
    for _ in range(3):
        httpx.post(f"{a.url}/api/v1/jobs/{job['id']}/checkpoints", json={}).raise_for_status()
    t.join(20)
    assert [e["type"] for e in received] == ["checkpoint.triggered"] * 3
    assert [e["data"]["checkpoint_id"] for e in received] == [1, 2, 3]


def test_concurrent_triggers_and_acks_for_many_jobs_on_two_replicas_never_fail_and_complete_each_checkpoint_once(
    replicas,
):
    a, b = replicas
    jobs = [_job(a.url, 4, max_concurrent=1000, timeout=600_000) for _ in range(12)]
    rounds = 4
    rng = random.Random(11)
    statuses: list[int] = []
    lock = threading.Lock()

    def post(url: str, path: str, body: dict) -> httpx.Response:
        r = httpx.post(url + path, json=body, timeout=60)
        with lock:
            statuses.append(r.status_code)
        return r

    def trigger(job: dict) -> tuple[dict, int]:
        r = post(rng.choice([a.url, b.url]), f"/api/v1/jobs/{job['id']}/checkpoints", {})
        return job, r.json()["id"]

    def ack(item) -> None:
        url, job, cp, i = item
        body = {"attempt": 1, "vertex": "src", "subtask_index": i}
        post(url, f"/api/v1/jobs/{job['id']}/checkpoints/{cp}/acks", body)

    with ThreadPoolExecutor(24) as pool:
        for _ in range(rounds):
            triggered = list(pool.map(trigger, jobs))
            # every subtask's ack goes to both replicas, all jobs mixed, so each replica's group commit locks
            # several jobs in one transaction while the other does the same
            sends = [(url, job, cp, i) for job, cp in triggered for i in range(4) for url in (a.url, b.url)]
            rng.shuffle(sends)
            list(pool.map(ack, sends))
    assert [s for s in statuses if s >= 500] == []
    assert all(s in (200, 201) for s in statuses), sorted(set(statuses))
    for job in jobs:
        page = httpx.get(f"{a.url}/api/v1/jobs/{job['id']}/checkpoints", params={"limit": 100}).json()
        assert [c["status"] for c in page["items"]] == ["COMPLETED"] * rounds
        events = httpx.get(f"{b.url}/api/v1/jobs/{job['id']}/events/history").json()
        completed = [e["data"]["checkpoint_id"] for e in events if e["type"] == "checkpoint.completed"]
        assert sorted(completed) == list(range(1, rounds + 1))
