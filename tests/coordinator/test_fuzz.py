"""The contract holds under generated requests: schemathesis sends requests generated from openapi.yaml to live
coordinators on SQLite and on PostgreSQL, with auth off and on, and every answer is a documented status with the
documented content type, headers and schema; no request produces a server error."""

from __future__ import annotations

import uuid

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.openapi import CONTRACT
from tests.live import LiveCoordinator

pytestmark = [pytest.mark.slow, pytest.mark.postgres]
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
EXAMPLES = 25  # per operation and target: 28 operations x 4 targets x 25, about 2,800 requests


def _seed(url: str, headers: dict) -> None:
    """A few jobs with attempts and checkpoints, so generated small ids often hit something real."""
    for parallelism in (1, 2):
        body = {"name": f"seed-{parallelism}", "graph": {"vertices": [{"id": "a", "parallelism": parallelism}]},
                "checkpoint": {"max_concurrent": 100}}
        job = httpx.post(f"{url}/api/v1/jobs", json=body, headers=headers).raise_for_status().json()
        httpx.post(f"{url}/api/v1/jobs/{job['id']}/attempts", json={}, headers=headers).raise_for_status()
        cp = httpx.post(f"{url}/api/v1/jobs/{job['id']}/checkpoints", json={}, headers=headers).json()
        httpx.post(f"{url}/api/v1/jobs/{job['id']}/checkpoints/{cp['id']}/acks",
                   json={"attempt": 1, "vertex": "a", "subtask_index": 0}, headers=headers)


@pytest.fixture(scope="module", params=["sqlite-open", "sqlite-auth", "postgres-open", "postgres-auth"])
def target(request, tmp_path_factory):
    database, auth = request.param.split("-")
    env = {"OVERTAKE_MAX_BLOB_SIZE": str(1024 * 1024)}
    if database == "postgres":
        env["OVERTAKE_DATABASE_URL"] = request.getfixturevalue("pg_databases").new()
    headers = {}
    if auth == "auth":
        env["OVERTAKE_ADMIN_TOKEN"] = "admin-" + uuid.uuid4().hex
        headers = {"Authorization": f"Bearer {env['OVERTAKE_ADMIN_TOKEN']}"}
    live = LiveCoordinator(tmp_path_factory.mktemp(request.param), env).start()
    _seed(live.url, headers)
    yield live, headers
    live.stop()


def _fuzz(live, headers: dict) -> list[str]:
    """Run every operation of the contract with generated requests; returns what failed."""
    failures = []
    for result in schemathesis.openapi.from_path(CONTRACT).get_all_operations():
        operation = result.ok()
        if operation.definition.raw.get("operationId") == "events":
            continue  # an endless event stream: followed in tests/client, not fuzzed

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def run(case):
            case.call_and_validate(base_url=live.url, headers=headers, checks=CHECKS, timeout=30)

        try:
            run()
        except Exception as exc:  # noqa: BLE001 - collected, reported all at once
            failures.append(f"{operation.method.upper()} {operation.path}: {exc}"[:3000])
    return failures


def test_generated_requests_get_documented_answers_and_no_server_error(target):
    live, headers = target
    failures = _fuzz(live, headers)
    assert failures == [], "\n\n".join(failures)
