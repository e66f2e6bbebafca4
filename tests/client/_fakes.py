"""Small builders of coordinator answers for the tests that need no server (retry policy, errors, streams)."""

from __future__ import annotations

import json

import httpx

NOW = 1_700_000_000_000


def checkpoint(checkpoint_id: int = 1, job_id: int = 1) -> dict:
    return {
        "id": checkpoint_id,
        "job_id": job_id,
        "attempt": 1,
        "status": "PENDING",
        "is_savepoint": False,
        "checkpoint_type": "unaligned",
        "subtask_modes": {"unaligned": 0, "aligned": 0, "aligned_over_budget": 0},
        "policy": "unaligned",
        "alignment_timeout": None,
        "trigger_timestamp": NOW,
        "latest_ack_timestamp": None,
        "completed_timestamp": None,
        "switched_to_unaligned_timestamp": None,
        "end_to_end_duration": None,
        "state_size": 0,
        "persisted_data": 0,
        "processed_data": 0,
        "alignment_duration": None,
        "num_subtasks": 2,
        "num_acknowledged_subtasks": 0,
        "failure_reason": None,
        "discarded": False,
    }


def ack_result(vertex: str = "src", index: int = 0) -> dict:
    return {
        "checkpoint_id": 1,
        "vertex": vertex,
        "subtask_index": index,
        "status": "PENDING",
        "num_acknowledged_subtasks": 1,
        "num_subtasks": 2,
        "duplicate": False,
    }


def blob_info(sha256: str, size: int) -> dict:
    return {
        "blob_id": "b1",
        "job_id": 1,
        "checkpoint_id": 1,
        "vertex": "src",
        "subtask_index": 0,
        "kind": "channel",
        "sha256": sha256,
        "size": size,
        "created_at": NOW,
    }


def error(status: int, code: str, message: str, headers: dict | None = None) -> httpx.Response:
    body = {"error": {"code": code, "message": message, "details": None}}
    return httpx.Response(status, json=body, headers=headers)


def sse_event(event_id: int, kind: str = "checkpoint.triggered", job_id: int = 1) -> bytes:
    data = {
        "id": event_id,
        "job_id": job_id,
        "type": kind,
        "timestamp": NOW,
        "data": {"checkpoint_id": event_id},
    }
    return f"id: {event_id}\nevent: {kind}\ndata: {json.dumps(data)}\n\n".encode()


class Script:
    """A MockTransport handler that answers the n-th request with the n-th answer and records the requests.

    An answer is an ``httpx.Response``, an exception to raise, or a callable taking the request.
    """

    def __init__(self, *answers):
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []
        self.bodies: list[bytes] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.bodies.append(request.read())
        if not self.answers:
            raise AssertionError(f"unexpected request {request.method} {request.url}")
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        if callable(answer):
            return answer(request)
        return answer

    async def handle_async(self, request: httpx.Request) -> httpx.Response:
        request.extensions["test_async"] = True  # tells stream answers to give an async body
        self.requests.append(request)
        self.bodies.append(await request.aread())
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        if callable(answer):
            return answer(request)
        return answer


def record_sleeps(monkeypatch, delays: list[float] | None = None) -> list[float]:
    """Record the client's back-off sleeps made on the test's own thread instead of sleeping, and return the list.

    ``client.sync`` sleeps through the ``time`` module, so the patch reaches every thread of the process: a thread
    an earlier test left behind (an event stream still reconnecting, a reporter) would add its own sleeps to the
    test's and stop sleeping at all. Those other threads still sleep, for real, and are not recorded."""
    import threading
    import time

    recorded: list[float] = [] if delays is None else delays
    me = threading.current_thread()
    real = time.sleep

    def sleep(seconds: float) -> None:
        if threading.current_thread() is me:
            recorded.append(seconds)
        else:
            real(seconds)

    monkeypatch.setattr("client.sync.time.sleep", sleep)
    return recorded
