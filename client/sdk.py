"""The Overtake SDK's public surface: the sync and async clients and their errors (wire models: contract.models).

from client.sdk import OvertakeClient

with OvertakeClient("http://127.0.0.1:8321") as c:
    job = c.create_job({"name": "wordcount", "graph": {"vertices": [{"id": "src", "parallelism": 2}]}})
    attempt = c.start_attempt(job.id)
    task = c.with_token(attempt.task_token)
"""

from client.aio import AsyncOvertakeClient
from client.errors import (
    Conflict,
    CoordinatorUnreachable,
    Forbidden,
    InvalidRequest,
    NotFound,
    OutcomeUnknown,
    OvertakeError,
    RangeNotSatisfiable,
    TooLarge,
    Unauthorized,
    Unavailable,
    UnexpectedResponse,
)
from client.sync import OvertakeClient

__all__ = [
    "AsyncOvertakeClient",
    "Conflict",
    "CoordinatorUnreachable",
    "Forbidden",
    "InvalidRequest",
    "NotFound",
    "OutcomeUnknown",
    "OvertakeError",
    "OvertakeClient",
    "RangeNotSatisfiable",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "UnexpectedResponse",
]
