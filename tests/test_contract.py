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
            assert op["responses"]["4XX"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
