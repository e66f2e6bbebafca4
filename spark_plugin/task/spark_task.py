"""The body of one Spark task of a pipeline's barrier stage: it hosts one subtask for its whole life.

Tasks listen on a TCP port, exchange ``host:port`` with ``BarrierTaskContext.allGather``, connect their input
channels, run the subtask loop and meet at ``BarrierTaskContext.barrier()`` before closing their channels, so no
task sees a peer vanish while it runs.
"""

from __future__ import annotations

import json
import pickle
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pyspark import BarrierTaskContext

from client.sync import OvertakeClient
from contract.models import SubtaskRestore
from spark_plugin.network.config import NetworkConfig
from spark_plugin.plan.job import JobPlan
from spark_plugin.plan.topology import SubtaskSpec
from spark_plugin.task.ack_relay import AckRelay, RelayReporter, relay_of
from spark_plugin.task.coordination import (
    DEFAULT_MAX_OUTAGE,
    SdkEvents,
    SubtaskIdentity,
    patiently,
)
from spark_plugin.task.life import SubtaskLife, build_subtask
from spark_plugin.task.state_store import BlobReader, CorruptBlobError, StateWriter
from spark_plugin.task.subtask import SubtaskFailed


@dataclass
class TaskBundle:
    """What every Spark task of the stage receives (pickled into the stage's closure)."""

    plan: JobPlan
    specs: list[SubtaskSpec]
    coordinator: str
    token: str | None
    job_id: int
    attempt: int
    events_after: int | None
    time_limit: float | None
    network: NetworkConfig
    stop_after_checkpoints: int | None = None
    restore: dict[tuple[str, int], SubtaskRestore] = field(default_factory=dict)
    """Each subtask's part of the attempt's restore plan, by (vertex, subtask index)."""
    restore_checkpoint: int | None = None
    max_outage: float = DEFAULT_MAX_OUTAGE


def _client(bundle: TaskBundle) -> OvertakeClient:
    """An SDK client that gives up quickly on an unreachable coordinator: the subtask's own backoff waits for it
    (up to ``max_outage``), so an outage is counted from its first failed request."""
    return OvertakeClient(bundle.coordinator, bundle.token, retries=2, backoff=0.1)


def _task_host(ctx: Any, pid: int) -> str:
    try:
        address = ctx.getTaskInfos()[pid].address
        host = address.rsplit(":", 1)[0]
        if host:
            return host
    except Exception:  # noqa: BLE001
        pass
    return socket.gethostbyname(socket.gethostname())


def _report_corrupt(client: OvertakeClient, bundle: TaskBundle, spec: SubtaskSpec, e: CorruptBlobError) -> None:
    """The blob is never replayed: the coordinator marks it, so the next attempt's plan falls back past its
    checkpoint and says why."""
    report = partial(
        client.report_corrupt_blob, bundle.job_id, e.blob_id, attempt=bundle.attempt, vertex=spec.vertex,
        subtask_index=spec.subtask_index, reason=str(e)[:2000],
    )
    patiently(report, f"reporting corrupt blob {e.blob_id}", bundle.max_outage)


def run_task(bundle: TaskBundle, _partition: Any) -> Iterator[bytes]:
    """Host the subtask of this task's partition until the run ends; yields its pickled ``SubtaskResult``."""
    ctx = BarrierTaskContext.get()
    pid = ctx.partitionId()
    spec = bundle.specs[pid]
    client = _client(bundle)
    # live metrics go through a client of their own that gives up at once: a report is never worth a wait
    metrics_client = OvertakeClient(bundle.coordinator, bundle.token, timeout=2.0, retries=0)
    who = SubtaskIdentity(bundle.job_id, bundle.attempt, spec.vertex, spec.subtask_index)
    events = SdkEvents(_client(bundle), bundle.job_id, bundle.events_after, bundle.max_outage)
    writer = StateWriter(f"{spec.vertex}-{spec.subtask_index}-a{bundle.attempt}.state")
    reporter = RelayReporter(client, who, metrics_client, token=bundle.token)
    life = SubtaskLife(
        build_subtask(
            bundle.plan, spec, reporter, events, bundle.network, bundle.attempt,
            stop_after_checkpoints=bundle.stop_after_checkpoints, max_outage=bundle.max_outage, state_writer=writer,
        )
    )
    part = bundle.restore.get((spec.vertex, spec.subtask_index))
    reader = BlobReader(part.blobs if part is not None else [], lambda blob_id: client.download_blob(bundle.job_id, blob_id))
    try:
        life.prepare(bundle.job_id, bundle.restore_checkpoint, part, reader.range)
    except CorruptBlobError as e:
        _report_corrupt(client, bundle, spec, e)
        raise SubtaskFailed(f"{spec.name}: {e}; reported, so the next attempt restores an older checkpoint") from e
    finally:
        reader.close()
    port = life.listen("0.0.0.0")
    # every task offers a relay; the lowest task of each host keeps its own, the others close theirs
    relay = (
        AckRelay(_client(bundle), bundle.job_id, bundle.token, attempt=bundle.attempt,
                 metrics_client=OvertakeClient(bundle.coordinator, bundle.token, timeout=2.0, retries=0))
        if bundle.network.ack_relay else None
    )
    try:
        me = {"task": pid, "host": _task_host(ctx, pid), "port": port, "up": time.time(),
              "relay": relay.start() if relay is not None else None}
        peers = [json.loads(m) for m in ctx.allGather(json.dumps(me))]
        serving = relay_of(peers, pid)
        if relay is not None and (serving is None or serving["task"] != pid):
            relay.close()
        reporter.use_relay(("127.0.0.1", serving["relay"]) if serving is not None else None)
        # one deadline for all tasks: the time limit counts from when the last task came up
        if bundle.time_limit is not None:
            life.subtask.deadline = max(m["up"] for m in peers) + bundle.time_limit
        life.connect({m["task"]: (m["host"], m["port"]) for m in peers})
        result = life.run()
        result = life.end(result, wait_for_peers=ctx.barrier)  # every subtask left its loop: channels may close
        if bundle.network.ack_relay:
            # Ending drained this task's ack worker, but a checkpoint answered while the tasks waited for each other
            # may still be acking in another task: no relay closes before every task of the stage sent its last ack
            # (a subtask that finds its relay gone acks on its own, correctly, but one request per ack again).
            ctx.barrier()
        result.acks_relayed = reporter.relayed
        result.metrics_relayed = reporter.metrics_relayed
    finally:  # Spark reuses Python workers: nothing of this task may outlive it
        reporter.close()
        if relay is not None:
            relay.close()
            relay.client.close()
            relay.metrics_client.close()
        writer.close()  # its hashing thread and its HTTP client (S3)
        client.close()
        metrics_client.close()
    yield pickle.dumps(result)
