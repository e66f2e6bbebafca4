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
BLOB_BYTES = Counter("overtake_blob_bytes_stored_total", "Bytes of blobs stored.", registry=REGISTRY)
BLOBS_DELETED = Counter("overtake_blobs_deleted_total", "Blobs deleted from the store.", registry=REGISTRY)


def setup_logging(level: str = "INFO", json_logs: bool = True) -> None:
    root = logging.getLogger()
    if getattr(root, "_overtake_configured", False):
        root.setLevel(level)
        return
    handler = logging.StreamHandler(sys.stderr)
    if json_logs:
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    root._overtake_configured = True  # type: ignore[attr-defined]
