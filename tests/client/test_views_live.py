"""What the UI and the command line read about a job besides its checkpoints, against the real coordinator: the
per-vertex summary of a checkpoint, a job's attempts (restored checkpoint, fallbacks, rescaling), what became of a
checkpoint's in-flight data, checkpoints that ended with their job, and the subtasks' live metrics."""

from __future__ import annotations

import time

import httpx
import pytest

from client.errors import Conflict, InvalidRequest, NotFound
from client.sync import OvertakeClient
from tests.client._jobs import complete_checkpoint, job_spec, upload_and_ack


@pytest.fixture
def sdk(coordinator):
    with OvertakeClient(coordinator.url) as c:
        yield c


def now_ms() -> int:
    return int(time.time() * 1000)


def test_a_checkpoint_sums_up_each_vertex_across_its_subtasks(sdk):
    job = sdk.create_job(job_spec())
    attempt = sdk.start_attempt(job.id)
    cp = sdk.trigger_checkpoint(job.id)
    upload_and_ack(sdk, attempt, cp, "src", 0, alignment_duration=10, start_delay=5)
    upload_and_ack(sdk, attempt, cp, "src", 1, alignment_duration=30, start_delay=15)
    detail = sdk.get_checkpoint(job.id, cp.id)
    src, sink = detail.vertices
    assert (src.vertex, src.parallelism, src.num_acknowledged_subtasks, src.num_unaligned) == ("src", 2, 2, 2)
    assert (src.alignment_duration.min, src.alignment_duration.avg, src.alignment_duration.max) == (10, 20, 30)
    assert (src.start_delay.min, src.start_delay.max) == (5, 15)
    assert src.processed_data.avg == 4096
    assert (sink.vertex, sink.num_acknowledged_subtasks, sink.end_to_end_duration.max) == ("sink", 0, None)
    assert detail.pending_subtasks == ["sink[0]"]


def test_an_aborted_checkpoint_waits_for_nobody_and_says_why(sdk):
    job = sdk.create_job(job_spec())
    sdk.start_attempt(job.id)
    cp = sdk.trigger_checkpoint(job.id)
    sdk.finish_job(job.id, "FINISHED")
    detail = sdk.get_checkpoint(job.id, cp.id)
    assert detail.status.value == "ABORTED" and detail.pending_subtasks == []
    assert detail.abort_reason == "job_ended" and "the job ended as FINISHED" in detail.failure_reason


def test_checkpoints_cut_short_by_the_end_of_their_job_are_not_counted_as_failures(sdk):
    job = sdk.create_job(job_spec())
    attempt = sdk.start_attempt(job.id)
    complete_checkpoint(sdk, attempt)
    declined = sdk.trigger_checkpoint(job.id)
    sdk.decline(job.id, declined.id, {"attempt": 1, "vertex": "src", "subtask_index": 0, "reason": "disk full"})
    sdk.trigger_checkpoint(job.id)
    sdk.finish_job(job.id, "FINISHED")
    stats = sdk.checkpoint_stats(job.id)
    assert (stats.counts.failed, stats.counts.not_finished, stats.counts.aborted) == (1, 1, 2)
    assert sdk.get_job(job.id).num_interrupted == 1
    assert sdk.get_checkpoint(job.id, declined.id).abort_reason == "declined"


def test_attempts_say_what_they_restored(sdk):
    job = sdk.create_job(job_spec())
    first = sdk.start_attempt(job.id)
    cp = complete_checkpoint(sdk, first)
    sdk.start_attempt(job.id, restore_from="latest", parallelism={"sink": 2})
    page = sdk.list_attempts(job.id)
    assert page.total == 2
    second, one = page.items
    assert (second.attempt, second.restored_checkpoint_id, second.ended_at) == (2, cp.id, None)
    assert [(r.vertex, r.old_parallelism, r.new_parallelism) for r in second.rescaled] == [("sink", 1, 2)]
    assert second.recorded and second.fallbacks == []
    assert (one.attempt, one.restored_checkpoint_id) == (1, None) and one.ended_at is not None


def test_an_attempt_that_fell_back_past_a_corrupt_checkpoint_says_which_and_why(sdk, coordinator):
    """A restore plan checks blobs by size (a stat); the restoring subtask verifies each sha256 as it reads and
    reports a mismatch, so the next attempt falls back past that checkpoint and says why."""
    job = sdk.create_job(job_spec(retained=3))
    first = sdk.start_attempt(job.id)
    older = complete_checkpoint(sdk, first)
    newer = complete_checkpoint(sdk, first)
    blob = sdk.get_checkpoint(job.id, newer.id).subtasks[0].operator_state
    second = sdk.start_attempt(job.id)
    assert second.restore_plan.checkpoint_id == newer.id  # same size: the stat cannot tell
    with OvertakeClient(coordinator.url, second.task_token) as task:
        task.report_corrupt_blob(job.id, blob.blob_id, attempt=second.attempt, vertex="src", subtask_index=0,
                                 reason=f"blob {blob.blob_id} is corrupt: sha256 mismatch")
    sdk.start_attempt(job.id)
    latest = sdk.list_attempts(job.id, limit=1).items[0]
    assert latest.restored_checkpoint_id == older.id
    assert [f.checkpoint_id for f in latest.fallbacks] == [newer.id]
    assert blob.blob_id in latest.fallbacks[0].reason and "corrupt" in latest.fallbacks[0].reason


def test_the_in_flight_data_of_a_checkpoint_collected_by_retention_is_reported_deleted_with_when(sdk):
    job = sdk.create_job(job_spec(retained=1))
    attempt = sdk.start_attempt(job.id)
    old = complete_checkpoint(sdk, attempt)
    assert sdk.channel_state(job.id, old.id).deleted is False
    new = complete_checkpoint(sdk, attempt)
    manifest = sdk.channel_state(job.id, old.id)
    assert (manifest.deleted, manifest.deleted_reason) == (True, "retention")
    assert manifest.deleted_at == sdk.get_checkpoint(job.id, new.id).completed_timestamp


def test_the_in_flight_data_of_an_aborted_checkpoint_is_reported_deleted(sdk):
    job = sdk.create_job(job_spec())
    sdk.start_attempt(job.id)
    cp = sdk.trigger_checkpoint(job.id)
    sdk.cancel_job(job.id)
    manifest = sdk.channel_state(job.id, cp.id)
    assert (manifest.deleted, manifest.deleted_reason) == (True, "aborted")
    aborted_at = sdk.get_checkpoint(job.id, cp.id).failure_timestamp
    assert aborted_at is not None and manifest.deleted_at == aborted_at


# --------------------------------------------------------------------------- live metrics


def report(sdk, job_id, vertex, index, at, attempt=1, **metrics):
    sdk.report_metrics(job_id, attempt, vertex, index, metrics, timestamp=at)


def test_live_metrics_add_up_per_vertex_and_take_the_most_backpressured_subtask(sdk):
    job = sdk.create_job(job_spec())
    sdk.start_attempt(job.id)
    t = now_ms()
    report(sdk, job.id, "src", 0, t, records_in_per_second=1000.0, backpressure=0.25, window_ms=1000)
    report(sdk, job.id, "src", 1, t, records_in_per_second=500.0, backpressure=0.75)
    live = sdk.live_metrics(job.id)
    src, sink = live.vertices
    assert (src.reporting, src.records_in_per_second, src.backpressure_max, src.backpressure_avg) == (
        2, 1500.0, 0.75, 0.5
    )
    assert (sink.reporting, sink.records_in_per_second, sink.backpressure_max) == (0, None, None)
    assert live.attempt == 1 and [s.subtask_index for s in src.subtasks] == [0, 1]


def test_a_late_or_repeated_metrics_report_never_replaces_a_newer_one(sdk):
    job = sdk.create_job(job_spec())
    sdk.start_attempt(job.id)
    t = now_ms()
    report(sdk, job.id, "src", 0, t, records_in_per_second=2.0)
    report(sdk, job.id, "src", 0, t - 1000, records_in_per_second=1.0)
    report(sdk, job.id, "src", 0, t, records_in_per_second=2.0)
    assert sdk.live_metrics(job.id).vertices[0].records_in_per_second == 2.0


def test_fields_the_coordinator_does_not_know_are_ignored_so_runtimes_can_report_more(sdk, coordinator):
    job = sdk.create_job(job_spec())
    sdk.start_attempt(job.id)
    r = httpx.post(
        f"{coordinator.url}/api/v1/jobs/{job.id}/attempts/1/subtasks/src/0/metrics",
        json={"timestamp": now_ms(), "metrics": {"records_in_per_second": 3.0, "watermark": 123}},
    )
    assert r.status_code == 204, r.text
    assert sdk.live_metrics(job.id).vertices[0].records_in_per_second == 3.0


def test_metrics_of_an_older_attempt_or_an_ended_job_are_refused_and_not_shown(sdk):
    job = sdk.create_job(job_spec())
    sdk.start_attempt(job.id)
    report(sdk, job.id, "src", 0, now_ms(), records_in_per_second=3.0)
    sdk.start_attempt(job.id)
    assert sdk.live_metrics(job.id).vertices[0].reporting == 0  # the new attempt has not reported yet
    with pytest.raises(Conflict, match="attempt"):
        report(sdk, job.id, "src", 0, now_ms(), attempt=1)
    sdk.cancel_job(job.id)
    with pytest.raises(Conflict, match="CANCELLED"):
        report(sdk, job.id, "src", 0, now_ms(), attempt=2)


def test_bad_metrics_reports_get_a_clear_4xx(sdk, coordinator):
    job = sdk.create_job(job_spec())
    sdk.start_attempt(job.id)
    with pytest.raises(NotFound, match="no subtask src\\[5\\]"):
        report(sdk, job.id, "src", 5, now_ms())
    with pytest.raises(NotFound, match="no vertex 'nope'"):
        report(sdk, job.id, "nope", 0, now_ms())
    with pytest.raises(InvalidRequest):
        report(sdk, job.id, "src", 0, now_ms(), backpressure=1.5)
    r = httpx.post(
        f"{coordinator.url}/api/v1/jobs/{job.id}/attempts/1/subtasks/src/0/metrics",
        json={"timestamp": -1, "metrics": {}},
    )
    assert r.status_code == 422 and "timestamp" in r.json()["error"]["message"]


def test_each_vertex_shows_the_lowest_watermark_of_its_subtasks_and_the_largest_lag(sdk):
    job = sdk.create_job(job_spec())
    sdk.start_attempt(job.id)
    t = now_ms()
    report(sdk, job.id, "src", 0, t, watermark=t - 1200, watermark_lag_ms=1200)
    report(sdk, job.id, "src", 1, t, watermark=t - 300, watermark_lag_ms=300)
    report(sdk, job.id, "sink", 0, t, records_in_per_second=5.0)  # no event time: no watermark
    src, sink = sdk.live_metrics(job.id).vertices
    assert (src.low_watermark, src.watermark_lag_max_ms) == (t - 1200, 1200)
    assert [(s.metrics.watermark, s.metrics.watermark_lag_ms) for s in src.subtasks] == [
        (t - 1200, 1200), (t - 300, 300)
    ]
    assert (sink.low_watermark, sink.watermark_lag_max_ms) == (None, None)


def test_an_idle_subtask_does_not_hold_the_vertex_watermark_back_unless_all_are_idle(sdk):
    job = sdk.create_job(job_spec())
    sdk.start_attempt(job.id)
    t = now_ms()
    report(sdk, job.id, "src", 0, t, watermark=t - 60_000, watermark_lag_ms=60_000, watermark_idle=True)
    report(sdk, job.id, "src", 1, t, watermark=t - 500, watermark_lag_ms=500, watermark_idle=False)
    src = sdk.live_metrics(job.id).vertices[0]
    assert (src.low_watermark, src.watermark_lag_max_ms) == (t - 500, 500)
    report(sdk, job.id, "src", 1, t + 1, watermark=t - 400, watermark_lag_ms=401, watermark_idle=True)
    src = sdk.live_metrics(job.id).vertices[0]
    assert (src.low_watermark, src.watermark_lag_max_ms) == (t - 60_000, 60_000)


def test_a_watermark_without_its_lag_is_given_the_lag_at_the_reports_timestamp(sdk):
    job = sdk.create_job(job_spec())
    sdk.start_attempt(job.id)
    t = now_ms()
    report(sdk, job.id, "src", 0, t, watermark=t - 2500)
    src = sdk.live_metrics(job.id).vertices[0]
    assert src.subtasks[0].metrics.watermark_lag_ms == 2500 and src.watermark_lag_max_ms == 2500


def test_bad_watermarks_get_a_clear_4xx_and_change_nothing(sdk, coordinator):
    job = sdk.create_job(job_spec())
    sdk.start_attempt(job.id)
    t = now_ms()
    report(sdk, job.id, "src", 0, t, watermark=t - 100, watermark_lag_ms=100)
    url = f"{coordinator.url}/api/v1/jobs/{job.id}/attempts/1/subtasks/src/0/metrics"
    bad = [
        ({"watermark": 2**63 - 1}, "watermark"),  # the end of event time is no time
        ({"watermark": "soon"}, "watermark"),
        ({"watermark": t, "watermark_lag_ms": 2**60}, "watermark_lag_ms"),
        ({"watermark_lag_ms": 5}, "without a watermark"),
        ({"watermark": t, "watermark_idle": "maybe"}, "watermark_idle"),
    ]
    for metrics, said in bad:
        r = httpx.post(url, json={"timestamp": t + 1000, "metrics": metrics})
        assert r.status_code == 422, (metrics, r.text)
        assert said in r.json()["error"]["message"], (metrics, r.text)
    src = sdk.live_metrics(job.id).vertices[0]
    assert (src.low_watermark, src.subtasks[0].timestamp, src.subtasks[0].metrics.watermark) == (t - 100, t, t - 100)


def test_a_source_subtasks_splits_with_their_positions_and_lag_are_shown_as_reported(sdk):
    job = sdk.create_job(job_spec())
    sdk.start_attempt(job.id)
    t = now_ms()
    splits = [{"split": "orders-0", "position": "42", "lag": 7}, {"split": "orders-2", "position": None, "lag": None}]
    report(sdk, job.id, "src", 0, t - 1000, splits=[{"split": "orders-0", "position": "1", "lag": 48}])
    report(sdk, job.id, "src", 0, t, splits=splits, splits_more=3)
    (s,) = sdk.live_metrics(job.id).vertices[0].subtasks
    assert [(x.split, x.position, x.lag) for x in s.metrics.splits] == [("orders-0", "42", 7), ("orders-2", None, None)]
    assert s.metrics.splits_more == 3


def test_more_splits_than_a_report_may_list_or_a_negative_lag_get_a_clear_4xx(sdk, coordinator):
    job = sdk.create_job(job_spec())
    sdk.start_attempt(job.id)
    url = f"{coordinator.url}/api/v1/jobs/{job.id}/attempts/1/subtasks/src/0/metrics"
    many = [{"split": f"p-{i}", "position": "0", "lag": 0} for i in range(101)]
    for splits in (many, [{"split": "p-0", "position": "0", "lag": -1}]):
        r = httpx.post(url, json={"timestamp": now_ms(), "metrics": {"splits": splits}})
        assert r.status_code == 422, r.text
    assert sdk.live_metrics(job.id).vertices[0].subtasks == []
