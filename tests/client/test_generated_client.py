"""A client generated from openapi.yaml by a mainstream third-party generator (openapi-python-client) drives the
whole lifecycle against a live coordinator with auth: the contract is enough to use the API, nothing in it
trips the generator, and every answer parses."""

from __future__ import annotations

import hashlib
import importlib
import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    tool = shutil.which("openapi-python-client") or str(Path(sys.executable).parent / "openapi-python-client")
    if not Path(tool).exists():
        pytest.fail("openapi-python-client is not installed (pip install -e '.[dev]')")
    out = tmp_path_factory.mktemp("generated")
    config = out / "config.yaml"
    config.write_text("post_hooks: []\n")
    done = subprocess.run(
        [tool, "generate", "--path", str(ROOT / "openapi.yaml"), "--meta", "none", "--output-path",
         str(out / "overtake_generated"), "--config", str(config)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stdout + done.stderr, done.stdout + done.stderr
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module("overtake_generated")
    finally:
        sys.path.remove(str(out))


def test_a_generated_client_drives_jobs_attempts_checkpoints_and_acks(generated, secured_coordinator):
    g = generated
    m = importlib.import_module("overtake_generated.models")
    jobs = {op: importlib.import_module(f"overtake_generated.api.jobs.{op}") for op in
            ("create_job", "start_attempt", "get_job", "report_running")}
    cps = {op: importlib.import_module(f"overtake_generated.api.checkpoints.{op}") for op in
           ("trigger_checkpoint", "get_checkpoint", "restore_plan")}
    subs = {op: importlib.import_module(f"overtake_generated.api.subtasks.{op}") for op in
            ("ack", "ack_with_state", "event_history")}
    from overtake_generated.types import File

    admin = g.AuthenticatedClient(base_url=secured_coordinator.url, token=secured_coordinator.admin_token)
    body = m.JobCreate.from_dict({
        "name": "generated",
        "graph": {"vertices": [{"id": "src", "parallelism": 1, "kind": "source"},
                               {"id": "agg", "parallelism": 1, "keyed": True}],
                  "edges": [{"source": "src", "target": "agg", "partitioning": "hash"}]},
        "checkpoint": {"policy": "unaligned", "max_concurrent": 4},
    })
    job = jobs["create_job"].sync(client=admin, body=body)
    assert isinstance(job, m.Job), job
    attempt = jobs["start_attempt"].sync(job.id, client=admin, body=m.AttemptCreate(restore_latest=True))
    assert isinstance(attempt, m.Attempt) and attempt.restore_plan.requested_latest is True
    task = g.AuthenticatedClient(base_url=secured_coordinator.url, token=attempt.task_token)
    for vertex in ("src", "agg"):
        state = jobs["report_running"].sync(job.id, 1, client=task, body=m.RunningReport(vertex=vertex, subtask_index=0))
        assert isinstance(state, m.RunningState)
    cp = cps["trigger_checkpoint"].sync(job.id, client=task, body=m.TriggerRequest())
    assert isinstance(cp, m.Checkpoint) and cp.status == m.CheckpointStatus.PENDING
    result = subs["ack"].sync(job.id, cp.id, client=task, body=m.SubtaskAck(attempt=1, vertex="src", subtask_index=0))
    assert isinstance(result, m.AckResult) and result.num_acknowledged_subtasks == 1
    state = b"the operator state of agg[0]"
    report = m.SubtaskReport(
        attempt=1, vertex="agg", subtask_index=0,
        operator_state=m.BlobDigest(sha256=hashlib.sha256(state).hexdigest(), size=len(state)),
    )
    with_state = subs["ack_with_state"].sync(
        job.id, cp.id, client=task,
        body=m.AckWithStateBody(ack=report, operator_state=File(payload=io.BytesIO(state), file_name="op")),
    )
    assert isinstance(with_state, m.AckResult), with_state
    assert with_state.status == m.CheckpointStatus.COMPLETED
    detail = cps["get_checkpoint"].sync(job.id, cp.id, client=task)
    assert detail.status == m.CheckpointStatus.COMPLETED and len(detail.subtasks) == 2
    plan = cps["restore_plan"].sync(job.id, client=task)
    assert isinstance(plan, m.RestorePlan) and plan.checkpoint_id == cp.id and plan.requested_latest
    events = subs["event_history"].sync(job.id, client=task)
    assert [e.type_ for e in events][-1] == m.EventType.CHECKPOINT_COMPLETED
    refused = jobs["get_job"].sync(job.id, client=g.AuthenticatedClient(base_url=secured_coordinator.url, token="x"))
    assert isinstance(refused, m.ErrorResponse) and refused.error.code == "unauthorized"
