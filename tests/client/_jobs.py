"""A small job and the subtask side of a checkpoint, for the tests that run against the real coordinator."""

from __future__ import annotations

import uuid

from client.sync import OvertakeClient
from contract.models import AckMetrics, Attempt, BlobRef, Checkpoint, SubtaskAck

# src (2 subtasks) --rebalance--> sink (1 subtask): three subtasks ack each checkpoint
SUBTASKS = [("src", 0), ("src", 1), ("sink", 0)]


def job_spec(**checkpoint) -> dict:
    return {
        "name": f"sdk-{uuid.uuid4().hex[:10]}",
        "graph": {
            "vertices": [
                {"id": "src", "parallelism": 2, "kind": "source"},
                {"id": "sink", "parallelism": 1, "kind": "sink"},
            ],
            "edges": [{"source": "src", "target": "sink", "partitioning": "rebalance"}],
        },
        "checkpoint": {"interval": None, "policy": "unaligned"} | checkpoint,
        "labels": {"suite": "client"},
    }


def state_of(checkpoint_id: int, vertex: str, index: int) -> bytes:
    return f"operator state of {vertex}[{index}] at checkpoint {checkpoint_id}".encode()


def upload_and_ack(c: OvertakeClient, attempt: Attempt, cp: Checkpoint, vertex: str, index: int, **metrics):
    """What a subtask does for a checkpoint: store its operator state, then ack with the blob's handle."""
    info = c.upload_blob(
        cp.job_id,
        cp.id,
        attempt=attempt.attempt,
        vertex=vertex,
        subtask_index=index,
        kind="operator",
        data=state_of(cp.id, vertex, index),
    )
    ack = SubtaskAck(
        attempt=attempt.attempt,
        vertex=vertex,
        subtask_index=index,
        operator_state=BlobRef(blob_id=info.blob_id, sha256=info.sha256, size=info.size),
        source_offsets={"partition-0": 10 * (cp.id + index)} if vertex == "src" else None,
        metrics=AckMetrics(
            sync_duration=3, async_duration=40, processed_data=4096, unaligned=True, **metrics
        ),
    )
    return c.ack(cp.job_id, cp.id, ack)


def complete_checkpoint(c: OvertakeClient, attempt: Attempt) -> Checkpoint:
    cp = c.trigger_checkpoint(attempt.job_id)
    for vertex, index in SUBTASKS:
        upload_and_ack(c, attempt, cp, vertex, index)
    return cp
