"""The coordinator's JSON log lines: one JSON object per line, without terminal escapes."""

from __future__ import annotations

import json
import logging

from app.observability import json_formatter


def test_a_json_log_line_carries_no_ansi_escapes_from_uvicorns_colour_message():
    # uvicorn logs its start-up lines with ``extra={"color_message": ...}``: the message with ANSI colours
    record = logging.getLogger("uvicorn.error").makeRecord(
        "uvicorn.error", logging.INFO, __file__, 1, "Uvicorn running on %s (Press CTRL+C to quit)",
        ("http://127.0.0.1:8321",), None,
        extra={"color_message": "Uvicorn running on \x1b[1m%s\x1b[0m (Press CTRL+C to quit)", "job": 7},
    )
    line = json_formatter().format(record)
    assert "\x1b" not in line and "\\u001b" not in line
    data = json.loads(line)
    assert data["message"] == "Uvicorn running on http://127.0.0.1:8321 (Press CTRL+C to quit)"
    assert data["job"] == 7, "other extra fields are kept"
