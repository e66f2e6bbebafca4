"""The Structured Streaming listener: existing PySpark queries report to the coordinator.

A query is a job found by its Spark query id, each micro-batch a completed aligned checkpoint keyed by its batch
id with Spark's figures, and the end of the query the end of the job. The first tests read recorded progress
events without Spark; the others run real queries on local Spark against a real coordinator.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from client.sync import OvertakeClient
from contract.models import CheckpointStatus, JobStatus
from spark_plugin.listener import OvertakeListener, install
from spark_plugin.listener.progress import checkpoint_of, failure_message, graph_of, job_spec, snapshot
from spark_plugin.listener.reporter import Outbox, Progress, Reporter, Terminated

# A progress event of a rate source -> groupBy count query, as PySpark 4 hands it to listeners.
RATE_PROGRESS = {
    "id": "3c9c87e2-8a32-47e5-9d12-6a474e5dbdd4",
    "runId": "872b03f1-dc19-49b9-8cd8-567b39618036",
    "name": "counts",
    "timestamp": "2026-11-21T23:19:24.000Z",
    "batchId": 73,
    "batchDuration": 340,
    "numInputRows": 5,
    "inputRowsPerSecond": 5.0,
    "processedRowsPerSecond": 14.7,
    "durationMs": {
        "addBatch": 236,
        "commitOffsets": 42,
        "getBatch": 0,
        "latestOffset": 0,
        "queryPlanning": 13,
        "triggerExecution": 340,
        "walCommit": 48,
    },
    "eventTime": {},
    "stateOperators": [
        {
            "operatorName": "stateStoreSave",
            "numRowsTotal": 3,
            "numRowsUpdated": 3,
            "allUpdatesTimeMs": 37,
            "numRowsRemoved": 0,
            "allRemovalsTimeMs": 0,
            "commitTimeMs": 119,
            "memoryUsedBytes": 1944,
            "numRowsDroppedByWatermark": 0,
            "numShufflePartitions": 2,
            "numStateStoreInstances": 2,
            "customMetrics": {"stateOnCurrentVersionSizeBytes": 888},
        }
    ],
    "sources": [
        {
            "description": "RateStreamV2[rowsPerSecond=5, rampUpTimeSeconds=0, numPartitions=default",
            "startOffset": 76,
            "endOffset": 77,
            "latestOffset": 77,
            "numInputRows": 5,
            "inputRowsPerSecond": 5.0,
            "processedRowsPerSecond": 14.7,
        }
    ],
    "sink": {"description": "MemorySink", "numOutputRows": 3},
}


def recorded(**changes) -> dict:
    from pyspark.sql.streaming.listener import StreamingQueryProgress

    return snapshot(StreamingQueryProgress.fromJson(json.loads(json.dumps(RATE_PROGRESS | changes))))


# --------------------------------------------------------------------------- without Spark


def test_a_micro_batch_becomes_a_checkpoint_keyed_by_its_batch_id_with_sparks_figures():
    body = checkpoint_of(recorded())
    assert body["id"] == 73
    assert body["completed_timestamp"] - body["trigger_timestamp"] == 340  # durationMs.triggerExecution
    assert (body["state_size"], body["processed_data"]) == (1944, 5)
    assert body["source_offsets"] == {"source-0": {"offset": 77}}
    metrics = body["metrics"]
    assert (metrics["walCommit"], metrics["commitOffsets"], metrics["durationMs"]["addBatch"]) == (
        48,
        42,
        236,
    )
    assert (metrics["stateRowsTotal"], metrics["inputRowsPerSecond"]) == (3, 5.0)


def test_rates_spark_cannot_compute_are_sent_as_null():
    assert checkpoint_of(recorded(inputRowsPerSecond=float("nan")))["metrics"]["inputRowsPerSecond"] is None


def test_the_job_graph_has_the_sources_the_stateful_operators_and_the_sink():
    spec = job_spec("q-1", "counts per key!", recorded(), {"team": "a"})
    graph = spec["graph"]
    assert [(v["id"], v["parallelism"]) for v in graph["vertices"]] == [
        ("source-0", 1),
        ("stateStoreSave-0", 2),
        ("sink", 2),
    ]
    assert [(e["source"], e["target"], e["partitioning"]) for e in graph["edges"]] == [
        ("source-0", "stateStoreSave-0", "hash"),
        ("stateStoreSave-0", "sink", "forward"),
    ]
    assert (spec["name"], spec["kind"], spec["labels"]) == (
        "counts_per_key",
        "structured_streaming",
        {"team": "a", "spark_query_id": "q-1"},
    )
    assert graph_of(None)["vertices"] == [{"id": "query", "parallelism": 1, "kind": "operator"}]


def test_the_graph_of_a_query_with_sparks_default_200_shuffle_partitions_is_valid():
    from app.domain.graph import validate_graph
    from contract.models import Graph

    state = dict(RATE_PROGRESS["stateOperators"][0], numShufflePartitions=200)
    graph = graph_of(recorded(stateOperators=[state, dict(state, operatorName="dedupe")]))
    validate_graph(Graph.model_validate(graph))
    assert [(v["id"], v["parallelism"]) for v in graph["vertices"]][1:] == [
        ("stateStoreSave-0", 200),
        ("dedupe-1", 200),
        ("sink", 200),
    ]


def test_a_stateful_operator_with_a_long_name_keeps_the_querys_graph():
    from contract.models import JobCreate

    state = dict(RATE_PROGRESS["stateOperators"][0], operatorName="transformWithState" + "x" * 300)
    spec = JobCreate.model_validate(job_spec("q-1", "long", recorded(stateOperators=[state]), {}))
    assert [v.id for v in spec.graph.vertices] == ["source-0", "transformWithState" + "x" * 82 + "-0", "sink"]
    assert len(spec.graph.vertices[1].name) == 200


def test_the_failure_message_is_the_exception_without_the_jvm_stack():
    trace = "ForeachBatchUserFuncException: boom\nValueError: boom\n\tat org.apache.Sink.add(Sink.scala:60)\n\tat x.y(z)"
    assert failure_message(trace) == "ForeachBatchUserFuncException: boom\nValueError: boom"


def test_a_full_buffer_drops_and_counts_micro_batches_but_keeps_the_end_of_a_query():
    outbox = Outbox(capacity=2)
    batches = [Progress("q", "r", None, {"batchId": n}) for n in range(4)]
    assert [outbox.put(b) for b in batches] == [True, True, False, False]
    assert outbox.put(Terminated("q", "r", None, None)) is True
    assert (outbox.dropped, outbox.pending()) == (2, 3)


def test_install_takes_the_coordinator_and_buffer_size_from_the_spark_conf():
    class Session:  # what install reads of a SparkSession
        conf = {
            "spark.overtake.coordinator": "http://coordinator.test:8321",
            "spark.overtake.listener.bufferSize": "7",
        }

        class streams:
            added: list = []
            addListener = added.append

    listener = install(Session(), drain_on_exit=0)
    try:
        assert Session.streams.added == [listener]
        assert (listener.coordinator_url, listener._outbox.capacity) == ("http://coordinator.test:8321", 7)
    finally:
        listener.close(timeout=1)


def test_a_coordinator_that_keeps_answering_500_does_not_hold_back_the_reports_behind():
    import httpx

    paths: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        return httpx.Response(500, json={"error": {"code": "internal", "message": "a bug"}})

    client = OvertakeClient("http://coordinator.test", retries=0, transport=httpx.MockTransport(answer))
    outbox = Outbox(capacity=10)
    reporter = Reporter(client, outbox, {}, backoff=0.001, max_backoff=0.001)
    reporter.start()
    for n in (0, 1):
        outbox.put(Progress("q", "r", None, recorded(batchId=n)))
    try:
        assert outbox.wait_empty(30)
        assert (reporter.snapshot_stats().rejected, len(paths)) == (2, 2 * 11)  # each tried 11 times
    finally:
        reporter.stop_event.set()
        reporter.join(5)


class QueryEvents:
    """PySpark's listener events of one query, built the way Spark hands them over (no JVM needed)."""

    def __init__(self, name: str) -> None:
        from pyspark.sql.streaming import listener as events

        self.events, self.id, self.name = events, uuid.uuid4(), name

    def started(self, run: uuid.UUID):
        return self.events.QueryStartedEvent(self.id, run, self.name, "2026-11-21T23:00:00.000Z", set())

    def progress(self, run: uuid.UUID, batch_id: int, **changes):
        body = RATE_PROGRESS | {"id": str(self.id), "runId": str(run), "name": self.name, "batchId": batch_id}
        return self.events.QueryProgressEvent(self.events.StreamingQueryProgress.fromJson(body | changes))

    def terminated(self, run: uuid.UUID, exception: str | None = None):
        return self.events.QueryTerminatedEvent(self.id, run, exception, None)


def job_of(listener: OvertakeListener, query: QueryEvents, client: OvertakeClient):
    assert listener.flush(60)
    return client.get_job(listener.stats().jobs[str(query.id)])


def test_the_end_of_a_run_told_after_the_start_of_its_restart_does_not_end_the_job(coordinator):
    """Spark tells listeners of a start at once, of progress and ends later: a restart's start can come first."""
    listener, query = OvertakeListener(coordinator.url, drain_on_exit=0), QueryEvents("restarted")
    first, second = uuid.uuid4(), uuid.uuid4()
    try:
        listener.onQueryStarted(query.started(first))
        listener.onQueryProgress(query.progress(first, 0))
        listener.onQueryStarted(query.started(second))
        listener.onQueryProgress(query.progress(first, 1))
        listener.onQueryTerminated(query.terminated(first))
        listener.onQueryProgress(query.progress(second, 2))
        with OvertakeClient(coordinator.url) as client:
            job = job_of(listener, query, client)
            assert (job.status, job.current_attempt) == (JobStatus.running, 2)
            listener.onQueryTerminated(query.terminated(second))
            job = job_of(listener, query, client)
            assert (job.status, job.current_attempt) == (JobStatus.finished, 2)
            assert checkpoint_ids(client, job.id) == [0, 1, 2]
    finally:
        listener.close(timeout=5)


def test_a_batch_re_run_after_a_restart_keeps_the_report_recorded_first(coordinator):
    listener, query = OvertakeListener(coordinator.url, drain_on_exit=0), QueryEvents("re-run")
    first, second = uuid.uuid4(), uuid.uuid4()
    try:
        listener.onQueryStarted(query.started(first))
        for n in (0, 1):
            listener.onQueryProgress(query.progress(first, n))
        listener.onQueryTerminated(query.terminated(first, "java.io.IOException: disk gone"))
        listener.onQueryStarted(query.started(second))
        listener.onQueryProgress(query.progress(second, 1, batchDuration=999))  # other figures: a 409
        listener.onQueryProgress(query.progress(second, 2))
        with OvertakeClient(coordinator.url) as client:
            job = job_of(listener, query, client)
            assert checkpoint_ids(client, job.id) == [0, 1, 2]
            assert client.get_checkpoint(job.id, 1).details["metrics"]["batchDuration"] == 340
        stats = listener.stats()
        assert (stats.reported, stats.duplicates, stats.rejected) == (3, 1, 0)
    finally:
        listener.close(timeout=5)


# --------------------------------------------------------------------------- on local Spark


@pytest.fixture
def listen(spark):
    """Adds OvertakeListeners with a short backoff to the shared session, and removes them afterwards."""
    made: list[OvertakeListener] = []

    def add(url: str, **options) -> OvertakeListener:
        listener = OvertakeListener(url, backoff=0.1, max_backoff=1.0, drain_on_exit=0, **options)
        spark.streams.addListener(listener)
        made.append(listener)
        return listener

    yield add
    for listener in made:
        spark.streams.removeListener(listener)
        listener.close(timeout=5)


def wait_for(what: str, condition, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def run_until_batch(query, batch_id: int) -> None:
    """Let a rate query run until it completed ``batch_id``, then stop it."""
    wait_for(
        f"batch {batch_id}", lambda: query.lastProgress is not None and query.lastProgress.batchId >= batch_id
    )
    query.stop()


def ended_job(client: OvertakeClient, listener: OvertakeListener, query, attempt: int = 1):
    """The query's job, once the end of run number ``attempt`` reached the coordinator."""
    job_id = wait_for("the job", lambda: listener.stats().jobs.get(str(query.id)))

    def ended():
        job = client.get_job(job_id)
        return job if job.status != JobStatus.running and job.current_attempt == attempt else None

    return wait_for(f"attempt {attempt} of job {job_id} to end", ended)


def checkpoint_ids(client: OvertakeClient, job_id: int) -> list[int]:
    items = client.list_checkpoints(job_id, limit=1000).items
    assert all(c.status == CheckpointStatus.completed for c in items)
    return sorted(c.id for c in items)


def rate_counts(spark, checkpoint_dir: Path, name: str):
    from pyspark.sql import functions as F

    counts = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 20)
        .load()
        .groupBy((F.col("value") % 5).alias("k"))
        .count()
    )
    return (
        counts.writeStream.queryName(name)
        .outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(checkpoint_dir))
        .trigger(processingTime="500 milliseconds")
        .start()
    )


@pytest.mark.spark
@pytest.mark.slow
def test_a_stateful_query_reports_each_batch_with_its_id_and_figures(spark, listen, coordinator, tmp_path):
    listener = listen(coordinator.url)
    query = rate_counts(spark, tmp_path / "checkpoint", f"counts_{uuid.uuid4().hex[:6]}")
    run_until_batch(query, 2)
    with OvertakeClient(coordinator.url) as client:
        job = ended_job(client, listener, query)
        assert (job.status, job.kind, job.labels["spark_query_id"]) == (
            JobStatus.finished,
            "structured_streaming",
            str(query.id),
        )
        assert [v.id for v in job.graph.vertices] == ["source-0", "stateStoreSave-0", "sink"]
        progress = {p.batchId: p for p in query.recentProgress}
        assert checkpoint_ids(client, job.id) == sorted(progress) == list(range(len(progress)))
        for batch_id, p in progress.items():
            cp = client.get_checkpoint(job.id, batch_id)
            assert cp.end_to_end_duration == p.durationMs["triggerExecution"]
            assert cp.processed_data == p.numInputRows
            assert cp.state_size == sum(op.memoryUsedBytes for op in p.stateOperators)
            assert cp.details["metrics"]["walCommit"] == p.durationMs["walCommit"]
            assert cp.details["metrics"]["stateRowsTotal"] == sum(op.numRowsTotal for op in p.stateOperators)
            assert cp.details["source_offsets"] == {
                "source-0": {"offset": json.loads(p.sources[0].endOffset)}
            }
    assert listener.stats().dropped == 0


@pytest.mark.spark
@pytest.mark.slow
def test_a_file_source_query_reports_the_file_log_offsets(spark, listen, coordinator, tmp_path):
    inbox, staging = tmp_path / "in", tmp_path / "staging"
    inbox.mkdir(), staging.mkdir()

    def drop_file(name: str, words: list[str]) -> None:
        (staging / name).write_text("".join(json.dumps({"word": w}) + "\n" for w in words))
        (staging / name).rename(inbox / name)

    listener = listen(coordinator.url)
    drop_file("a.json", ["x", "y", "x"])
    counts = spark.readStream.schema("word string").json(str(inbox)).groupBy("word").count()
    query = (
        counts.writeStream.outputMode("complete")
        .format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    query.processAllAvailable()
    drop_file("b.json", ["z", "x"])
    query.processAllAvailable()
    query.stop()
    with OvertakeClient(coordinator.url) as client:
        job = ended_job(client, listener, query)
        assert job.name == str(query.id)  # an unnamed query's job is named by its id
        assert checkpoint_ids(client, job.id) == [0, 1]
        assert [client.get_checkpoint(job.id, n).processed_data for n in (0, 1)] == [3, 2]
        plan = client.restore_plan(job.id)
        assert (plan.checkpoint_id, plan.subtasks[0].source_offsets) == (1, {"logOffset": 1})


@pytest.mark.spark
@pytest.mark.slow
def test_a_query_restarted_from_its_checkpoint_continues_the_same_job(spark, listen, coordinator, tmp_path):
    listener = listen(coordinator.url)
    name = f"restarted_{uuid.uuid4().hex[:6]}"
    first = rate_counts(spark, tmp_path / "checkpoint", name)
    run_until_batch(first, 1)
    with OvertakeClient(coordinator.url) as client:
        job = ended_job(client, listener, first)
        last_of_first = max(checkpoint_ids(client, job.id))
        second = rate_counts(spark, tmp_path / "checkpoint", name)
        assert second.id == first.id and second.runId != first.runId
        run_until_batch(second, last_of_first + 2)
        resumed = ended_job(client, listener, second, attempt=2)
        assert resumed.id == job.id and resumed.status == JobStatus.finished
        assert [j.id for j in client.list_jobs(label=f"spark_query_id={first.id}").items] == [job.id]
        ids = checkpoint_ids(client, job.id)
        assert ids == list(range(len(ids)))  # batch ids continue: none reused, none skipped
        assert min(p.batchId for p in second.recentProgress) == last_of_first + 1
        assert {client.get_checkpoint(job.id, i).attempt for i in ids} == {1, 2}


@pytest.mark.spark
@pytest.mark.slow
def test_batches_completed_while_the_coordinator_is_down_are_reported_once_it_is_back(
    spark, listen, fresh_coordinator, tmp_path
):
    coordinator = fresh_coordinator.start()
    listener = listen(coordinator.url, buffer_size=100)
    query = rate_counts(spark, tmp_path / "checkpoint", f"outage_{uuid.uuid4().hex[:6]}")
    wait_for("a first report", lambda: listener.stats().reported >= 1)
    coordinator.stop()
    down_at = query.lastProgress.batchId
    wait_for("batches during the outage", lambda: query.lastProgress.batchId >= down_at + 3)
    assert listener.stats().pending >= 1  # held back, not lost
    coordinator.start()  # same port, same data directory
    run_until_batch(query, down_at + 4)
    with OvertakeClient(coordinator.url) as client:
        job = ended_job(client, listener, query)
        assert checkpoint_ids(client, job.id) == sorted(p.batchId for p in query.recentProgress)
    stats = listener.stats()
    assert (stats.dropped, stats.rejected) == (0, 0)


@pytest.mark.spark
@pytest.mark.slow
def test_a_failing_query_ends_its_job_failed_with_the_exception_message(spark, listen, coordinator, tmp_path):
    from pyspark.errors import StreamingQueryException

    inbox = tmp_path / "in"
    inbox.mkdir()
    (inbox / "a.json").write_text('{"word": "x"}\n')

    def explode(batch, batch_id):
        raise ValueError(f"boom in batch {batch_id}")

    listener = listen(coordinator.url)
    query = (
        spark.readStream.schema("word string")
        .json(str(inbox))
        .writeStream.queryName(f"failing_{uuid.uuid4().hex[:6]}")
        .foreachBatch(explode)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    with pytest.raises(StreamingQueryException):
        query.awaitTermination(60)
    with OvertakeClient(coordinator.url) as client:
        job = ended_job(client, listener, query)
        assert job.status == JobStatus.failed
        assert "ValueError: boom in batch 0" in job.status_message
        assert "\tat org.apache" not in job.status_message
        assert client.list_checkpoints(job.id).total == 0
