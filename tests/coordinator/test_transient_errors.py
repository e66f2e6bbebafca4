"""Transient database failures (deadlock, serialization failure, lost connection) never reach a client as a 500:
the request runs again a bounded number of times, and is otherwise answered 503 with Retry-After."""

from __future__ import annotations

from app.db.session import TransientDatabaseError, is_transient
from app.domain import jobs


def _failing(times: int, real):
    calls = {"n": 0}

    async def cancel(s, job_id):
        calls["n"] += 1
        if calls["n"] <= times:
            raise TransientDatabaseError("DeadlockDetectedError: deadlock detected (injected)")
        return await real(s, job_id)

    return cancel, calls


async def test_a_request_that_meets_a_transient_failure_runs_again_and_succeeds(sqlite_api, monkeypatch):
    job = await sqlite_api.job()
    cancel, calls = _failing(2, jobs.cancel_job)
    monkeypatch.setattr(jobs, "cancel_job", cancel)
    r = await sqlite_api.client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "CANCELLED"
    assert calls["n"] == 3


async def test_a_request_that_keeps_failing_transiently_is_answered_503_with_retry_after(sqlite_api, monkeypatch):
    job = await sqlite_api.job()
    cancel, calls = _failing(1000, jobs.cancel_job)
    monkeypatch.setattr(jobs, "cancel_job", cancel)
    r = await sqlite_api.client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 503 and r.headers["retry-after"]
    assert r.json()["error"]["code"] == "unavailable" and "retry" in r.json()["error"]["message"]
    assert calls["n"] == sqlite_api.app.state.settings.db_retries + 1
    assert (await sqlite_api.client.get(f"/api/v1/jobs/{job['id']}")).json()["status"] == "RUNNING"


def test_deadlocks_serialization_failures_and_lost_connections_are_transient():
    from sqlalchemy.exc import DBAPIError, IntegrityError

    class Orig(Exception):
        def __init__(self, sqlstate):
            self.sqlstate = sqlstate

    assert is_transient(DBAPIError("UPDATE", {}, Orig("40P01")))
    assert is_transient(DBAPIError("UPDATE", {}, Orig("40001")))
    assert is_transient(DBAPIError("SELECT", {}, Orig("08006")))
    assert is_transient(ConnectionResetError())
    assert not is_transient(IntegrityError("INSERT", {}, Orig("23505")))
    assert not is_transient(ValueError())
