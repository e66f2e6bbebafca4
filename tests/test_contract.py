"""The OpenAPI contract: openapi.yaml is what the app generates, and every SDK call targets a route in it."""

from __future__ import annotations

import re

import yaml

from app.openapi import CONTRACT, render


def test_openapi_yaml_is_what_the_app_generates():
    assert CONTRACT.exists(), "openapi.yaml is missing: run `python -m app.openapi`"
    assert CONTRACT.read_text() == render(), "openapi.yaml drifted from the app: run `python -m app.openapi`"


def test_operation_ids_are_unique_and_stable_names():
    spec = yaml.safe_load(CONTRACT.read_text())
    ids = [op["operationId"] for ops in spec["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"[a-z_]+", i) for i in ids)


def test_every_error_is_documented_as_the_one_error_shape():
    spec = yaml.safe_load(CONTRACT.read_text())
    for path, ops in spec["paths"].items():
        if not path.startswith("/api/"):
            continue
        for op in ops.values():
            assert op["responses"]["4XX"]["content"]["application/json"]["schema"]["$ref"].endswith(
                "/ErrorResponse"
            )


def _route_exists(spec: dict, method: str, path: str) -> bool:
    for template, operations in spec["paths"].items():
        pattern = "^" + re.sub(r"\{[^}]+\}", "[^/]+", template) + "$"
        if re.match(pattern, path) and method.lower() in operations:
            return True
    return False


def test_every_sdk_method_targets_a_route_of_the_contract():
    import inspect

    from client._endpoints import Endpoints
    from contract.models import Decline, SubtaskAck

    class Recorder(Endpoints):
        def __init__(self):
            self.calls = []

        def _send(self, call):
            self.calls.append((call.method, call.path))

    sample = {
        "job_id": 3,
        "checkpoint_id": 4,
        "blob_id": "a" * 32,
        "job": {"name": "j", "graph": {"vertices": [{"id": "a", "parallelism": 1}]}},
        "ack": SubtaskAck(attempt=1, vertex="a", subtask_index=0),
        "acks": [SubtaskAck(attempt=1, vertex="a", subtask_index=0)],
        "decline": Decline(attempt=1, vertex="a", subtask_index=0, reason="x"),
        "status": "FINISHED",
        "body": {"id": 0, "trigger_timestamp": 0, "completed_timestamp": 0},
        "attempt": 1,
        "vertex": "a",
        "subtask_index": 0,
        "kind": "channel",
        "data": b"x",
        "metrics": {"records_in_per_second": 1.0},
        "reports": [{"vertex": "a", "subtask_index": 0, "timestamp": 1, "metrics": {"records_in_per_second": 1.0}}],
        "reason": "sha256 mismatch",
    }
    spec = yaml.safe_load(CONTRACT.read_text())
    methods = [m for m, _ in inspect.getmembers(Endpoints, inspect.isfunction) if not m.startswith("_")]
    assert len(methods) >= 18
    for name in methods:
        rec = Recorder()
        fn = getattr(rec, name)
        params = inspect.signature(fn).parameters
        kwargs = {p: sample[p] for p in params if p in sample}
        fn(**kwargs)
        assert rec.calls, f"SDK method {name} sent nothing"
        for method, path in rec.calls:
            assert _route_exists(spec, method, path), (
                f"SDK method {name} calls {method} {path}, not in openapi.yaml"
            )
    # the event stream of both clients
    assert _route_exists(spec, "GET", "/api/v1/jobs/3/events")
