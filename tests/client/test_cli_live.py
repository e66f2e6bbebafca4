"""The `overtake` command line against the real coordinator: --json gives the models, tables read well,
errors are the server's message in one line with exit status 1."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from cli.main import app
from client.errors import NotFound
from client.sync import OvertakeClient
from contract.models import Checkpoint, CheckpointDetail, Event, Job, JobPage, RestorePlan
from tests.client._jobs import SUBTASKS, complete_checkpoint, job_spec

WIDE = {"COLUMNS": "250"}


@pytest.fixture
def sdk(coordinator):
    with OvertakeClient(coordinator.url) as c:
        yield c


@pytest.fixture
def overtake(coordinator):
    """Runs the command line against the live coordinator; returns the click Result."""
    runner = CliRunner()

    def run(*args: str, env: dict | None = None):
        return runner.invoke(app, ["--url", coordinator.url, *args], env=WIDE | (env or {}))

    return run


@pytest.fixture
def checkpointed(sdk):
    """A running job with one completed checkpoint."""
    job = sdk.create_job(job_spec())
    attempt = sdk.start_attempt(job.id)
    return job, attempt, complete_checkpoint(sdk, attempt)


def ok(result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def test_jobs_list_json_is_a_job_page(overtake, checkpointed):
    job, _, _ = checkpointed
    page = JobPage.model_validate_json(ok(overtake("--json", "jobs", "list", "--limit", "5")))
    assert page.items[0].id == job.id
    assert page.items[0].latest_completed_checkpoint_id == checkpointed[2].id


def test_jobs_list_table_names_the_job_and_its_status(overtake, checkpointed):
    job, _, _ = checkpointed
    row = next(line for line in ok(overtake("jobs", "list")).splitlines() if job.name in line)
    assert str(job.id) in row
    assert "RUNNING" in row


def test_jobs_show_describes_the_graph_and_config(overtake, checkpointed):
    job, _, cp = checkpointed
    out = ok(overtake("jobs", "show", str(job.id)))
    assert f"{job.id} {job.name} (pipeline)" in out
    assert "unaligned" in out
    assert "rebalance" in out
    assert re.search(rf"latest completed\s+{cp.id} at ", out)
    assert Job.model_validate_json(ok(overtake("--json", "jobs", "show", str(job.id)))).name == job.name


def test_checkpoints_show_has_a_row_per_subtask(overtake, checkpointed):
    job, _, cp = checkpointed
    out = ok(overtake("checkpoints", "show", str(job.id), str(cp.id)))
    assert "COMPLETED" in out
    for vertex, index in SUBTASKS:
        row = next(line for line in out.splitlines() if f"{vertex}[{index}]" in line)
        assert "4.0 KiB" in row  # processed data of the ack
        assert "40 ms" in row  # async duration
    assert re.search(r"acknowledged\s+3/3", out)
    by_vertex = out.split("by vertex")[1].split("┏")[1].split("subtasks")[0]
    src = next(line for line in by_vertex.splitlines() if "│ src " in line)
    assert "2/2" in src and "4.0 KiB / 4.0 KiB" in src  # processed: avg / max across its two subtasks
    detail = CheckpointDetail.model_validate_json(
        ok(overtake("--json", "checkpoints", "show", str(job.id), str(cp.id)))
    )
    assert len(detail.subtasks) == 3


def test_checkpoints_trigger_and_list(overtake, checkpointed):
    job, _, done = checkpointed
    triggered = Checkpoint.model_validate_json(
        ok(overtake("--json", "checkpoints", "trigger", str(job.id), "--policy", "aligned"))
    )
    assert triggered.policy.value == "aligned"
    rows = ok(overtake("checkpoints", "list", str(job.id))).splitlines()
    assert any("PENDING" in r and f" {triggered.id} " in f" {r} " for r in rows)
    assert any("COMPLETED" in r and "3/3" in r for r in rows)
    out = ok(overtake("checkpoints", "list", str(job.id), "--status", "completed"))
    assert "PENDING" not in out and "COMPLETED" in out


def test_a_refused_trigger_prints_the_reason_and_exits_1(overtake, sdk, checkpointed):
    job, _, _ = checkpointed
    sdk.trigger_checkpoint(job.id)
    result = overtake("checkpoints", "trigger", str(job.id))
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ")
    assert "concurrent" in result.stderr
    assert "Traceback" not in result.output


def test_savepoint_prints_what_was_triggered(overtake, checkpointed):
    job, _, _ = checkpointed
    out = ok(overtake("savepoint", str(job.id)))
    assert out.startswith("triggered savepoint ")
    assert f"of job {job.id}" in out and "PENDING" in out


def test_restore_plan_lists_what_each_subtask_gets(overtake, checkpointed):
    job, _, cp = checkpointed
    out = ok(overtake("restore-plan", str(job.id)))
    assert f"restore from checkpoint {cp.id}" in out
    row = next(line for line in out.splitlines() if "src[1]" in line)
    assert '"partition-0":' in row
    plan = RestorePlan.model_validate_json(
        ok(overtake("--json", "restore-plan", str(job.id), "--checkpoint", str(cp.id)))
    )
    assert plan.checkpoint_id == cp.id


def test_an_unknown_checkpoint_prints_the_servers_message(overtake, sdk, checkpointed):
    job, _, _ = checkpointed
    with pytest.raises(NotFound) as expected:
        sdk.get_checkpoint(job.id, 424242)
    result = overtake("checkpoints", "show", str(job.id), "424242")
    assert result.exit_code == 1
    assert result.stderr == f"error: {expected.value.message}\n"


def test_events_prints_json_lines_and_stops_after_count(overtake, sdk, checkpointed):
    job, _, _ = checkpointed
    history = sdk.event_history(job.id)
    lines = ok(overtake("--json", "events", str(job.id), "--count", "2")).splitlines()
    assert [Event.model_validate_json(line) for line in lines] == history[:2]
    after = ok(overtake("events", str(job.id), "--after", str(history[-2].id), "--count", "1"))
    assert after.startswith(f"#{history[-1].id} ")
    assert history[-1].type.value in after


def test_checkpoints_stats_summarises(overtake, checkpointed):
    job, _, _ = checkpointed
    out = ok(overtake("checkpoints", "stats", str(job.id)))
    said = " ".join(out.split())
    assert "1 checkpoints: 1 completed, 0 failed, 0 not finished" in said and "0 in progress; 0 of them savepoints" in said
    assert json.loads(ok(overtake("--json", "checkpoints", "stats", str(job.id))))["counts"]["completed"] == 1


def test_jobs_cancel(overtake, checkpointed):
    job, _, _ = checkpointed
    assert ok(overtake("jobs", "cancel", str(job.id))).strip() == f"job {job.id} {job.name}: CANCELLED"


def test_the_token_comes_from_the_environment(secured_coordinator):
    runner = CliRunner()
    args = ["--url", secured_coordinator.url, "--json", "jobs", "list"]
    denied = runner.invoke(app, args, env={"OVERTAKE_TOKEN": ""})
    assert denied.exit_code == 1 and denied.stderr.startswith("error: ")
    allowed = runner.invoke(app, args, env={"OVERTAKE_TOKEN": secured_coordinator.admin_token})
    assert allowed.exit_code == 0, allowed.output
    JobPage.model_validate_json(allowed.stdout)


def test_cli_api_and_job_count_checkpoints_by_state_in_the_same_words(overtake, sdk):
    """One job with a checkpoint in every state: the API's counts, the job's, `jobs show` and `checkpoints stats`
    say the same: 1 completed, 1 failed (declined), 1 not finished (the job ended), 0 in progress."""
    job = sdk.create_job(job_spec(tolerable_failures=10))
    attempt = sdk.start_attempt(job.id)
    complete_checkpoint(sdk, attempt)
    declined = sdk.trigger_checkpoint(job.id)
    sdk.decline(job.id, declined.id, {"attempt": attempt.attempt, "vertex": "src", "subtask_index": 0, "reason": "x"})
    sdk.trigger_checkpoint(job.id)
    sdk.finish_job(job.id, "FINISHED")
    counts = sdk.checkpoint_stats(job.id).counts
    assert (counts.completed, counts.failed, counts.not_finished, counts.in_progress) == (1, 1, 1, 0)
    assert counts.total == counts.completed + counts.failed + counts.not_finished + counts.in_progress
    j = sdk.get_job(job.id)
    assert (j.num_completed, j.num_failed, j.num_not_finished, j.num_in_progress) == (1, 1, 1, 0)
    words = "1 completed, 1 failed, 1 not finished"
    assert words in " ".join(ok(overtake("checkpoints", "stats", str(job.id))).split())
    assert words in " ".join(ok(overtake("jobs", "show", str(job.id))).split())


def test_an_unknown_job_points_to_the_command_that_lists_jobs(overtake):
    result = overtake("jobs", "show", "999999")
    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert "job 999999 does not exist" in said and "'overtake jobs list'" in said and "GET /api" not in said
