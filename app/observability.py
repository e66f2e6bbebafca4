"""Prometheus metrics and structured (JSON) logging of the coordinator."""

from __future__ import annotations

import logging
import sys

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

CHECKPOINTS = Counter(
    "overtake_checkpoints_total",
    "Checkpoints by outcome (triggered, completed, aborted).",
    ["outcome"],
    registry=REGISTRY,
)
CHECKPOINT_DURATION = Histogram(
    "overtake_checkpoint_duration_seconds",
    "End-to-end duration of completed checkpoints.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
    registry=REGISTRY,
)
ACKS = Counter(
    "overtake_acks_total", "Acks by result (recorded, duplicate, refused).", ["result"], registry=REGISTRY
)
ACK_BATCH = Histogram(
    "overtake_ack_commit_batch_size",
    "Acks committed per group-commit transaction.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
    registry=REGISTRY,
)
ACK_COMMIT_SECONDS = Histogram(
    "overtake_ack_commit_seconds",
    "Duration of each ack group-commit transaction, from its first statement to its commit (a retry's included).",
    buckets=(0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 1, 5),
    registry=REGISTRY,
)
SCHEDULER_FAILURES = Counter(
    "overtake_scheduler_failures_total",
    "Scheduler actions on one job that failed (the job shows the error; other jobs are not held up).",
    ["action"],
    registry=REGISTRY,
)
BLOB_BYTES = Counter("overtake_blob_bytes_stored_total", "Bytes of blobs stored.", registry=REGISTRY)
BLOBS_DELETED = Counter("overtake_blobs_deleted_total", "Blobs deleted from the store.", registry=REGISTRY)


QUIET = {"alembic": logging.WARNING, "httpx": logging.WARNING}
"""Loggers whose INFO lines are noise (Alembic's 'Context impl SQLiteImpl.' at every start, httpx's every request);
they speak at DEBUG."""


def json_formatter() -> logging.Formatter:
    """The JSON log line: time, level, logger, message and the record's extra fields, except uvicorn's
    ``color_message`` (the message again with ANSI colour escapes, which a JSON log must not carry)."""
    from pythonjsonlogger.core import RESERVED_ATTRS
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s",
                         reserved_attrs=[*RESERVED_ATTRS, "color_message"])


def setup_logging(level: str = "INFO", log_format: str | bool = "json") -> None:
    """One handler on the root logger, in one format (``json`` or ``text``), for the coordinator's loggers and
    uvicorn's (``overtake serve`` hands uvicorn's loggers to the root). ``True``/``False`` mean json/text."""
    if isinstance(log_format, bool):
        log_format = "json" if log_format else "text"
    root = logging.getLogger()
    for name, quiet in QUIET.items():
        logging.getLogger(name).setLevel(quiet if logging.getLevelName(level) != logging.DEBUG else logging.DEBUG)
    if getattr(root, "_overtake_configured", False):
        root.setLevel(level)
        return
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(json_formatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    root._overtake_configured = True  # type: ignore[attr-defined]
