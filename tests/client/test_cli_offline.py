"""The command line's behaviour that needs no coordinator: missing parts, unreachable coordinator, rendering.

A MockTransport stands in for the coordinator where only the output format is under test.
"""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from client import cli
from client.sync import OvertakeClient
from tests.client._fakes import NOW, Script, checkpoint, error

runner = CliRunner()


@pytest.fixture
def coordinator(monkeypatch):
    """Routes the CLI's client to a scripted fake coordinator."""
    script = Script()

    def client(url=None, token=None):
        return OvertakeClient("http://fake:1", token=token, retries=0, transport=httpx.MockTransport(script))

    monkeypatch.setattr(cli, "OvertakeClient", client)
    return script


def test_a_missing_optional_module_is_one_line_and_exit_2(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "benchmarks.cli", None)  # as if the benchmarks were not installed
    result = runner.invoke(cli.app, ["bench", "--rounds", "3"])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error: the benchmarks (benchmarks.cli) is not available")
    assert "Traceback" not in result.output


def test_an_unreachable_coordinator_is_reported_with_its_url_and_exit_1(monkeypatch):
    monkeypatch.setattr("client.sync.time.sleep", lambda _: None)
    result = runner.invoke(
        cli.app, ["--url", "http://127.0.0.1:9", "jobs", "show", "1"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 1
    assert "cannot reach the coordinator at http://127.0.0.1:9" in result.stderr
    assert "Traceback" not in result.output


def test_server_errors_print_the_servers_message_and_exit_1(coordinator):
    coordinator.answers.append(
        error(404, "not_found", "job 42 does not exist; list jobs with 'overtake jobs list'")
    )
    result = runner.invoke(cli.app, ["jobs", "cancel", "42"])
    assert result.exit_code == 1
    assert result.stderr == "error: job 42 does not exist; list jobs with 'overtake jobs list'\n"
    assert result.stdout == ""


def test_checkpoint_show_prints_a_row_per_subtask(coordinator):
    detail = checkpoint(7) | {
        "status": "COMPLETED",
        "end_to_end_duration": 2350,
        "num_acknowledged_subtasks": 1,
        "subtasks": [
            {
                "vertex": "map",
                "subtask_index": 1,
                "ack_timestamp": NOW + 2000,
                "end_to_end_duration": 2000,
                "state_size": 2048,
                "sync_duration": 3,
                "async_duration": 1500,
                "alignment_duration": 0,
                "start_delay": 40,
                "processed_data": 10 * 1024**2,
                "persisted_data": 1536,
                "unaligned": True,
            }
        ],
        "pending_subtasks": ["map[0]"],
    }
    coordinator.answers.append(httpx.Response(200, json=detail))
    result = runner.invoke(cli.app, ["checkpoints", "show", "1", "7"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if "map[1]" in line)
    for shown in ("2.00 s", "1.50 s", "40 ms", "2.0 KiB", "10.0 MiB", "1.5 KiB", "yes"):
        assert shown in row
    assert "waiting for: map[0]" in result.stdout
    assert coordinator.requests[0].url.path == "/api/v1/jobs/1/checkpoints/7"


def test_json_output_is_the_models_json(coordinator):
    coordinator.answers.append(httpx.Response(201, json=checkpoint(3)))
    result = runner.invoke(cli.app, ["--json", "checkpoints", "trigger", "1", "--policy", "unaligned"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == checkpoint(3) | {"stop_job": False, "details": None}
    assert json.loads(coordinator.bodies[0]) == {"policy": "unaligned"}


def test_demo_passes_its_arguments_through_and_exits_with_their_status(monkeypatch):
    import sys
    import types

    received = []
    fake = types.ModuleType("spark_plugin.demo")
    fake.main = lambda argv: received.append(argv) or 3
    monkeypatch.setitem(sys.modules, "spark_plugin.demo", fake)
    result = runner.invoke(cli.app, ["demo", "--records", "1000", "--help", "-x"])
    assert received == [["--records", "1000", "--help", "-x"]]
    assert result.exit_code == 3
