"""The contract's common ground: the limits of ids and figures, the name rule, the strict base model and the
JSON object type that every area of the contract uses."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
)

NAME_PATTERN = r"^[A-Za-z0-9_.\-]{1,128}$"
NAME_RE = re.compile(NAME_PATTERN)

# What the database's columns hold, and sane ranges for what the API takes.
MAX_ID = 2**63 - 1  # job, checkpoint and event ids, offsets (64-bit columns)
MAX_ATTEMPT = 2**31 - 1  # attempt numbers (32-bit columns)
MAX_PARALLELISM = 32768  # key groups per vertex, so subtask indices and key groups are below this
MAX_FIGURE = 2**46  # a subtask's byte counts, record counts, durations (ms) and timestamps (ms since the epoch)
MAX_CONFIG_MS = 7 * 24 * 3600 * 1000  # a week: the longest interval, timeout, pause or alignment timeout


def _range(lo: int, hi: int) -> dict[str, Any]:
    """A range the JSON schema shows, checked by a validator that can say it in the field's own words."""
    return {"json_schema_extra": {"minimum": lo, "maximum": hi}}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _non_finite(value: Any, where: str) -> str | None:
    """Where in a JSON value a number is NaN or infinite (what parsers accept beyond JSON), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _non_finite(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def _finite_only(value: dict[str, Any]) -> dict[str, Any]:
    where = _non_finite(value, "")
    if where is not None:
        raise ValueError(
            f"{where} is not a finite number (NaN and Infinity are not JSON and cannot be stored as it); "
            "send a number, a string or null"
        )
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(_finite_only)]
"""A JSON object kept as it is (source offsets, an engine's figures): only JSON values, no NaN or Infinity."""


def rules_extra(*rules: str) -> dict[str, Any]:
    """The OpenAPI of an operation whose body follows rules JSON Schema cannot say (one field against another, a
    graph's shape): the rules in plain words as ``x-overtake-rules``; a body that breaks one is refused with the
    documented 422 naming it."""
    return {"x-overtake-rules": list(dict.fromkeys(rules))}
