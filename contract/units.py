"""The API's units for people: sizes are bytes (and durations milliseconds) on the wire; this is how they read."""

from __future__ import annotations

UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(n: int | float | None, missing: str = "-") -> str:
    """``1536`` -> ``1.5 KiB``; bytes below 1 KiB as they are, with thousands separators; ``missing`` for None."""
    if n is None:
        return missing
    value = float(n)
    for unit in UNITS:
        if abs(value) < 1024 or unit == UNITS[-1]:
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
