"""The contract holds under generated requests: schemathesis sends requests generated from openapi.yaml to live
coordinators on SQLite and on PostgreSQL, with auth off and on, and every answer is a documented status with the
documented content type, headers and schema; no request produces a server error.

The spec and the server also agree on what is valid: data the spec allows is accepted (or refused only for missing
or conflicting state, 404/409, or a rule the operation lists in ``x-overtake-rules``, 422), and data it forbids is
refused with a 4xx."""

from __future__ import annotations

import uuid

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import negative_data_rejection

from app.openapi import CONTRACT
from tests.live import LiveCoordinator

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
EXAMPLES = 25  # per operation and target: 28 operations x 4 targets x 25, about 2,800 requests
STRICT_EXAMPLES = 25  # per operation and mode, on one target: about 1,500 requests, under a minute
STATE_REFUSALS = {404, 409}  # the spec cannot know which ids exist or what state they are in


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


def positive_data_conformance(ctx, response, case) -> None:
    """Data the spec allows is accepted: a 4xx only for missing or conflicting state, or for a broken rule of the
    operation's x-overtake-rules (422)."""
    if case.meta is None or not case.meta.generation.mode.is_positive:
        return
    status = response.status_code
    rules = case.operation.definition.raw.get("x-overtake-rules")
    if 200 <= status < 300 or status in STATE_REFUSALS or (status == 422 and rules):
        return
    raise AssertionError(f"the spec allows this request, the server refused it with {status}: {response.text[:500]}")


def negative_data_conformance(ctx, response, case) -> None:
    """Data the spec forbids is refused with a 4xx. Unknown query parameters are left out: OpenAPI cannot forbid
    them, and the server ignores them as HTTP servers do."""
    known = {p.name for p in case.operation.iter_parameters() if p.location == "query"}
    if set(case.query or {}) - known:
        return None
    return negative_data_rejection(ctx, response, case)


def _fuzz(live, headers: dict, modes=(GenerationMode.POSITIVE,), checks=CHECKS, examples=EXAMPLES) -> list[str]:
    """Run every operation of the contract with generated requests; returns what failed."""
    failures = []
    operations = [result.ok() for result in schemathesis.openapi.from_path(CONTRACT).get_all_operations()]
    for operation, mode in ((operation, mode) for operation in operations for mode in modes):
        if operation.definition.raw.get("operationId") == "events":
            continue  # an endless event stream: followed in tests/client, not fuzzed

        @settings(
            max_examples=examples,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(generation_mode=mode))
        def run(case):
            case.call_and_validate(base_url=live.url, headers=headers, checks=checks, timeout=30)

        try:
            run()
        except Unsatisfiable:
            if mode.is_negative:  # nothing to negate: no parameters and no body (/healthz)
                continue
            raise
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - collected, reported all at once (a failure group is one)
            failures.append(f"{mode.value} {operation.method.upper()} {operation.path}: {exc}"[:3000])
    return failures


@pytest.mark.slow
@pytest.mark.postgres
def test_generated_requests_get_documented_answers_and_no_server_error(target):
    live, headers = target
    failures = _fuzz(live, headers)
    assert failures == [], "\n\n".join(failures)


@pytest.fixture(scope="module")
def sqlite_with_auth(tmp_path_factory):
    token = "admin-" + uuid.uuid4().hex
    env = {"OVERTAKE_MAX_BLOB_SIZE": str(1024 * 1024), "OVERTAKE_ADMIN_TOKEN": token}
    headers = {"Authorization": f"Bearer {token}"}
    live = LiveCoordinator(tmp_path_factory.mktemp("strict"), env).start()
    _seed(live.url, headers)
    yield live, headers
    live.stop()


def test_the_spec_and_the_server_accept_and_refuse_the_same_requests(sqlite_with_auth):
    """Positive conformance (allowed data accepted) and negative conformance (forbidden data refused with a 4xx,
    never a 2xx or 5xx), derandomized so the same requests run every time."""
    live, headers = sqlite_with_auth
    checks = [not_a_server_error, positive_data_conformance, negative_data_conformance]
    failures = _fuzz(live, headers, (GenerationMode.POSITIVE, GenerationMode.NEGATIVE), checks, STRICT_EXAMPLES)
    assert failures == [], "\n\n".join(failures)
