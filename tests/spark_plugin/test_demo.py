"""``overtake demo`` runs on the shared Spark session against a given coordinator and reports its checkpoints."""

from __future__ import annotations

import pytest

from cli import demo
from client.sync import OvertakeClient


@pytest.mark.spark
@pytest.mark.slow
def test_demo_runs_one_policy_against_a_given_coordinator(spark, coordinator, capsys):
    code = demo.run(
        demo.DemoOptions(coordinator=coordinator.url, duration=4, interval=400, only="unaligned", record_cost=0.3,
                         buffer_size=4096)
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "unaligned checkpoints" in out and "median end-to-end" in out
    assert f"the UI: {coordinator.url}/" in out and f"{coordinator.url}/#/jobs/" in out
    with OvertakeClient(coordinator.url) as client:
        jobs = [j for j in client.list_jobs(limit=200).items if j.name.startswith("demo-unaligned-")]
        assert jobs and jobs[0].num_completed >= 1


def test_summary_leaves_out_warm_up_and_counts_checkpoints_in_the_words_of_the_ui_and_the_api():
    class C:
        def __init__(self, id, status, e2e=None, reason=None, persisted=0):
            from types import SimpleNamespace

            self.id, self.status, self.end_to_end_duration = id, SimpleNamespace(value=status), e2e
            self.failure_reason, self.persisted_data, self.alignment_duration = reason, persisted, 0
            self.abort_reason = reason.split(":")[0] if reason else None

    cps = [C(1, "COMPLETED", 7000), C(2, "COMPLETED", 100, persisted=10), C(3, "COMPLETED", 300, persisted=30),
           C(4, "ABORTED", reason="job_ended: the job ended as FINISHED"), C(5, "ABORTED", reason="subsumed: x"),
           C(6, "ABORTED", reason="expired: took longer than 600000 ms")]
    s = demo.summarize(cps, records=500, seconds=5)
    assert s["checkpoints after warm-up"] == 5 and s["completed"] == 2
    assert (s["failed"], s["not finished"], s["in progress"]) == (1, 2, 0)
    assert s["max end-to-end"] == 300 and s["avg persisted in-flight"] == 20
    assert s["records/s (slow stage)"] == 100
