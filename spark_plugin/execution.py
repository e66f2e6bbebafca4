"""Running a pipeline on Spark: register the job and an attempt, then one barrier stage with one task per subtask.

Each Spark task hosts one subtask (a chain of operators). Tasks listen on a TCP port, exchange ``host:port``
with ``BarrierTaskContext.allGather``, connect their input channels, run the subtask loop and meet at
``BarrierTaskContext.barrier()`` before closing their channels, so no task sees a peer vanish while it runs.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from spark_plugin.config import NetworkConfig
from spark_plugin.pipeline import JobPlan, Pipeline, PipelineError
from spark_plugin.subtask import SubtaskResult
from spark_plugin.topology import TaskSpec, task_specs

log = logging.getLogger("overtake.run")


class RunFailed(RuntimeError):
    """The barrier stage failed; the message says which job and attempt, and the Spark error.

    ``job_id``, ``attempt`` and ``restore_plan`` (the attempt's ``RestorePlan``) let a supervisor restart it.
    """

    def __init__(self, message: str, job_id: int | None = None, attempt: int | None = None,
                 restore_plan: Any = None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.attempt = attempt
        self.restore_plan = restore_plan


@dataclass
class RunResult:
    """The outcome of one run: the job and attempt it ran as, and every subtask's result."""

    job_id: int
    attempt: int
    status: str
    subtasks: list[SubtaskResult] = field(default_factory=list)
    duration: float = 0.0
    restore_plan: Any = None
    """The attempt's ``client.models.RestorePlan``: the checkpoint restored and any ``fallbacks``."""

    def outputs(self, sink_id: str) -> list[Any]:
        """All records a :class:`~spark_plugin.sinks.CollectSink` with this operator id received."""
        out: list[Any] = []
        for s in sorted(self.subtasks, key=lambda s: (s.vertex, s.subtask_index)):
            got = s.outputs.get(sink_id)
            if got is not None and "records" in got:
                out.extend(got["records"])
        return out


@dataclass
class TaskBundle:
    """What every Spark task receives (pickled into the stage's closure)."""

    plan: JobPlan
    specs: list[TaskSpec]
    coordinator: str
    token: str | None
    job_id: int
    attempt: int
    events_after: int | None
    time_limit: float | None
    network: NetworkConfig
    stop_after_checkpoints: int | None = None
    restore: dict = field(default_factory=dict)
    restore_checkpoint: int | None = None


def task_slots(sc: Any) -> int:
    """How many tasks the Spark master can run at once (a barrier stage needs one slot per task)."""
    master = sc.master or ""
    cpus = int(sc.getConf().get("spark.task.cpus", "1") or 1)
    m = re.match(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?$", master)
    if m:
        n = m.group(1)
        cores = (os.cpu_count() or 1) if n == "*" else int(n or 1)
        return max(cores // cpus, 0)
    return max(sc.defaultParallelism // cpus, 0)


def _event_cursor(client: Any, job_id: int, attempt: int) -> int | None:
    """The id of this attempt's ``attempt.started`` event: tasks follow the events after it."""
    after: int | None = None
    cursor: int | None = None
    while True:
        page = client.event_history(job_id, after=after, limit=1000)
        for ev in page:
            if getattr(ev.type, "value", ev.type) == "attempt.started" and ev.data.get("attempt") == attempt:
                cursor = ev.id
        if len(page) < 1000:
            return cursor
        after = page[-1].id


def run_pipeline(
    pipeline: Pipeline,
    spark: Any,
    coordinator: str,
    *,
    checkpoint: Any = None,
    job_name: str | None = None,
    token: str | None = None,
    time_limit: float | None = None,
    network: NetworkConfig | None = None,
    restore_from: int | str | None = "latest",
    labels: dict[str, str] | None = None,
    job_id: int | None = None,
    finish: bool = True,
    stop_after_checkpoints: int | None = None,
    fail_job_on_error: bool = True,
) -> RunResult:
    """Run ``pipeline`` on Spark as one barrier stage, checkpointed by the coordinator at ``coordinator``.

    ``checkpoint`` is a ``client.models.CheckpointConfig`` (or dict); ``time_limit`` (seconds) ends the run
    even if the sources have not; a job cancelled through the coordinator ends it too. With ``job_id`` the run
    is a new attempt of that job, restored from ``restore_from`` ("latest" completed checkpoint, an id, or None
    for a fresh start); without it a new job is registered. With ``finish`` (the default) the job is marked
    FINISHED when the sources end or the time limit passes; ``finish=False`` leaves it open for another attempt.
    ``stop_after_checkpoints`` ends the run once that many checkpoints completed (tests, benchmarks).
    ``fail_job_on_error=False`` leaves the job open when the barrier stage fails (the supervisor restarts it).
    The time limit counts from the moment all Spark tasks of the stage are up.
    """
    from client.models import CheckpointConfig, Graph, JobCreate
    from client.sync import OvertakeClient

    plan = pipeline.plan()
    specs = task_specs(plan)
    sc = spark.sparkContext
    slots = task_slots(sc)
    if slots < len(specs):
        chains = ", ".join(f"{v.name} x{v.parallelism}" for v in plan.vertices)
        raise PipelineError(
            f"pipeline {plan.name!r} runs {len(specs)} subtasks ({chains}) as one Spark barrier stage, which needs "
            f"{len(specs)} task slots, but the Spark master {sc.master!r} offers {slots}; "
            f"use local[{len(specs)}] (or more executor cores)"
        )
    if checkpoint is None:
        checkpoint = CheckpointConfig()
    elif isinstance(checkpoint, dict):
        checkpoint = CheckpointConfig(**checkpoint)
    client = OvertakeClient(coordinator, token)
    try:
        if job_id is None:
            job = client.create_job(
                JobCreate(name=job_name or plan.name, graph=Graph(**plan.graph()), checkpoint=checkpoint,
                          labels=labels or {})
            )
        else:
            job = client.get_job(job_id)
        attempt = client.start_attempt(job.id, restore_from=restore_from)
        for fb in attempt.restore_plan.fallbacks:
            log.warning("job %s attempt %s: checkpoint %s passed over: %s", job.id, attempt.attempt,
                        fb.checkpoint_id, fb.reason)
        restore = {
            (s.vertex, s.subtask_index): s.model_dump(mode="json") for s in attempt.restore_plan.subtasks
        }
        after = _event_cursor(client, job.id, attempt.attempt)
        started = time.time()
        bundle = TaskBundle(
            plan=plan,
            specs=specs,
            coordinator=coordinator,
            token=attempt.task_token or token,
            job_id=job.id,
            attempt=attempt.attempt,
            events_after=after,
            time_limit=time_limit,
            stop_after_checkpoints=stop_after_checkpoints,
            network=network or NetworkConfig(),
            restore=restore,
            restore_checkpoint=attempt.restore_plan.checkpoint_id,
        )
        n = len(specs)
        sc.setJobDescription(f"overtake job {job.id} ({plan.name}) attempt {attempt.attempt}")
        rdd = sc.parallelize(range(n), n).barrier().mapPartitions(lambda it: run_task(bundle, it))
        try:
            rows = rdd.collect()
        except Exception as e:
            message = f"job {job.id} attempt {attempt.attempt}: the Spark barrier stage failed: {_short(e)}"
            if fail_job_on_error:
                _finish(client, job.id, "FAILED", message, attempt.attempt)
            raise RunFailed(message, job.id, attempt.attempt, attempt.restore_plan) from e
        results = sorted((pickle.loads(r) for r in rows), key=lambda r: (r.vertex, r.subtask_index))
        statuses = {r.status for r in results}
        status = "finished" if statuses == {"finished"} else sorted(statuses - {"finished"})[0]
        if finish and not status.startswith("job "):
            _finish(client, job.id, "FINISHED", None if status == "finished" else status, attempt.attempt)
        return RunResult(job.id, attempt.attempt, status, results, time.time() - started, attempt.restore_plan)
    finally:
        client.close()


def _short(e: BaseException) -> str:
    text = str(e)
    for line in text.splitlines():
        if "SubtaskFailed" in line or "PipelineError" in line or "Error:" in line:
            return line.strip()[:500]
    return text.strip().splitlines()[0][:500] if text.strip() else type(e).__name__


def _finish(client: Any, job_id: int, status: str, message: str | None, attempt: int) -> None:
    try:
        client.finish_job(job_id, status, message, attempt=attempt)
    except Exception as e:  # noqa: BLE001 - the run's outcome matters more than the bookkeeping
        log.warning("could not mark job %s %s: %s", job_id, status, e)


def _task_host(ctx: Any, pid: int) -> str:
    try:
        address = ctx.getTaskInfos()[pid].address
        host = address.rsplit(":", 1)[0]
        if host:
            return host
    except Exception:  # noqa: BLE001
        pass
    return socket.gethostbyname(socket.gethostname())


def run_task(bundle: TaskBundle, _partition: Any):
    """The body of one Spark task: host one subtask until the run ends; yields its pickled result."""
    from pyspark import BarrierTaskContext

    from client.sync import OvertakeClient
    from spark_plugin.connect import Listener, connect_inputs
    from spark_plugin.coordination import SdkEvents, SdkReporter, TaskIdentity
    from spark_plugin.tasks import build_subtask

    ctx = BarrierTaskContext.get()
    pid = ctx.partitionId()
    spec = bundle.specs[pid]
    listener = Listener("0.0.0.0")
    peers = [
        json.loads(m)
        for m in ctx.allGather(
            json.dumps({"task": pid, "host": _task_host(ctx, pid), "port": listener.port, "up": time.time()})
        )
    ]
    addresses = {m["task"]: (m["host"], m["port"]) for m in peers}
    # one deadline for all tasks: the time limit counts from when the last task came up
    deadline = max(m["up"] for m in peers) + bundle.time_limit if bundle.time_limit is not None else None
    client = OvertakeClient(bundle.coordinator, bundle.token)
    who = TaskIdentity(bundle.job_id, bundle.attempt, spec.vertex, spec.subtask_index)
    events = SdkEvents(OvertakeClient(bundle.coordinator, bundle.token), bundle.job_id, bundle.events_after)
    subtask = build_subtask(
        bundle.plan, spec, SdkReporter(client, who), events, bundle.network, bundle.attempt, deadline,
        bundle.stop_after_checkpoints,
    )
    subtask.rewind(bundle.job_id, bundle.restore_checkpoint)
    part = bundle.restore.get((spec.vertex, spec.subtask_index))
    if bundle.restore_checkpoint is not None and part is not None:
        from spark_plugin.restore import restore_subtask

        def fetch(blob_id: str, start: int | None, end: int | None) -> bytes:
            return client.download_blob(bundle.job_id, blob_id, start, end)

        restore_subtask(subtask, part, fetch, bundle.restore_checkpoint)
    listener.serve(subtask)
    connect_inputs(subtask, addresses)
    result = subtask.run()
    stop = threading.Event()
    finished = threading.Thread(target=subtask.serve_finished, args=(stop,), name="finished", daemon=True)
    finished.start()  # keeps acknowledging checkpoints while the other subtasks still run
    ctx.barrier()  # every subtask left its loop: closing channels now breaks nobody's input
    stop.set()
    finished.join(10)
    subtask.settle(result.status)  # sinks commit the output of the final checkpoint before the task ends
    subtask.close_operators(result)
    subtask.close()
    listener.close()
    result.acked = list(subtask.ack_worker.acked)
    result.declined = list(subtask.ack_worker.declined)
    result.report_errors = list(subtask.ack_worker.errors)
    client.close()
    yield pickle.dumps(result)
