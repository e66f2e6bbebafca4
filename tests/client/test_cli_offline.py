"""The command line's behaviour that needs no coordinator: missing parts, unreachable coordinator, rendering.

A MockTransport stands in for the coordinator where only the output format is under test.
"""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from cli import main as cli
from client.sync import OvertakeClient
from tests.client._fakes import NOW, Script, checkpoint, error, record_sleeps

runner = CliRunner()


@pytest.fixture
def coordinator(monkeypatch):
    """Routes the CLI's client to a scripted fake coordinator."""
    script = Script()

    def client(url=None, token=None, **_):
        return OvertakeClient("http://fake:1", token=token, retries=0, transport=httpx.MockTransport(script))

    monkeypatch.setattr("cli.app.OvertakeClient", client)  # where the session makes its clients
    return script


def test_a_missing_optional_module_is_one_line_and_exit_2(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "benchmarks.cli", None)  # as if the benchmarks were not installed
    result = runner.invoke(cli.app, ["bench", "--quick"])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error: the benchmarks (benchmarks.cli) is not available")
    assert "Traceback" not in result.output


def test_an_unreachable_coordinator_is_reported_in_the_command_lines_terms_and_exit_1():
    result = runner.invoke(
        cli.app, ["--url", "http://127.0.0.1:9", "jobs", "show", "1"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 1
    assert "cannot reach the coordinator at http://127.0.0.1:9" in result.stderr
    assert "Is it running? Start one with 'overtake serve'" in result.stderr and "--url" in result.stderr
    assert "/api/v1" not in result.stderr and "GET" not in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--url", "ftp://coordinator", "coordinator URL 'ftp://coordinator' must start with http:// or https://"),
        ("--url", "http://127.0.0.1:83a1", "coordinator URL 'http://127.0.0.1:83a1' is not a valid URL"),
        ("--url", "http://[::1", "coordinator URL 'http://[::1' is not a valid URL"),
        ("--token", "s3cr\u00e9t", "the token has a non-ASCII character at position 5 of 6"),
        ("--token", "s3cret\n", "the token has a space or control character at position 7 of 7"),
    ],
)
def test_a_url_or_token_the_client_cannot_use_is_one_error_line_and_exit_1(option, value, said):
    args = ["--url", "http://127.0.0.1:9"] if option == "--token" else []
    result = runner.invoke(cli.app, [*args, option, value, "jobs", "list"], env={"COLUMNS": "400"})
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {said}")
    assert "s3cr" not in result.stderr  # a token is never echoed
    assert isinstance(result.exception, SystemExit)


def test_the_command_line_gives_up_on_a_down_coordinator_after_two_quick_retries(monkeypatch):
    delays = record_sleeps(monkeypatch)
    result = runner.invoke(cli.app, ["--url", "http://127.0.0.1:9", "jobs", "list"])
    assert result.exit_code == 1
    assert len(delays) == cli.CLI_RETRIES and sum(delays) <= 0.6  # at most 0.2 + 0.4 s of backoff


@pytest.fixture
def scripted(monkeypatch):
    """Routes the CLI's own client, with the CLI's retry settings, to a scripted fake coordinator; records the waits."""
    script = Script()
    delays = record_sleeps(monkeypatch)

    def client(*args, **kwargs):
        return OvertakeClient(*args, transport=httpx.MockTransport(script), **kwargs)

    monkeypatch.setattr("cli.app.OvertakeClient", client)  # where the session makes its clients
    script.delays = delays
    return script


def test_a_busy_coordinators_long_retry_after_is_waited_at_most_a_second_per_retry(scripted):
    busy = error(503, "unavailable", "the database is busy", headers={"Retry-After": "3600"})
    scripted.answers.extend([busy] * (cli.CLI_RETRIES + 1))
    result = runner.invoke(cli.app, ["jobs", "list"])
    assert result.exit_code == 1
    assert result.stderr == "error: the database is busy\n"
    assert len(scripted.delays) == cli.CLI_RETRIES and max(scripted.delays) <= cli.CLI_MAX_BACKOFF


def test_a_coordinator_that_does_not_answer_in_time_is_said_to_be_slow_not_down(scripted):
    scripted.answers.extend([httpx.ReadTimeout("timed out")] * (cli.CLI_RETRIES + 1))
    result = runner.invoke(cli.app, ["jobs", "show", "1"], env={"COLUMNS": "400"})
    assert result.exit_code == 1
    assert "did not answer within 10 s, 3 times: it may be overloaded or stuck" in result.stderr
    assert "Is it running" not in result.stderr


def test_a_connection_closed_before_the_answer_is_said_to_be_closed_not_unreachable(scripted):
    scripted.answers.extend([httpx.RemoteProtocolError("Server disconnected")] * (cli.CLI_RETRIES + 1))
    result = runner.invoke(cli.app, ["jobs", "show", "1"], env={"COLUMNS": "400"})
    assert result.exit_code == 1
    assert "closed the connection without a complete answer, 3 times" in result.stderr
    assert "may be restarting" in result.stderr and "Is it running" not in result.stderr


def test_server_errors_print_the_servers_message_and_exit_1(coordinator):
    coordinator.answers.append(
        error(404, "not_found", "job 42 does not exist; list jobs with 'overtake jobs list'")
    )
    result = runner.invoke(cli.app, ["jobs", "cancel", "42"])
    assert result.exit_code == 1
    assert result.stderr == "error: job 42 does not exist; list jobs with 'overtake jobs list'\n"
    assert result.stdout == ""


def test_an_answer_that_is_not_the_apis_is_one_error_line_naming_the_url_and_exit_1(coordinator):
    coordinator.answers.append(httpx.Response(200, text="<html>a router's admin page</html>"))
    result = runner.invoke(cli.app, ["jobs", "list"], env={"COLUMNS": "400"})
    assert result.exit_code == 1
    assert result.stderr.startswith("error: the server at http://fake:1 answered GET /api/v1/jobs with HTTP 200")
    assert "Overtake coordinator" in result.stderr and "--url" in result.stderr
    assert isinstance(result.exception, SystemExit)  # an exit status, not an exception out of the command


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


def test_checkpoint_show_says_what_the_adaptive_policy_chose_and_why(coordinator):
    reason = "backpressure 0.93 ≥ 0.5: an aligned barrier would queue behind full buffers"
    detail = checkpoint(8) | {
        "policy": "unaligned",
        "decision": {"requested": "adaptive", "chosen": "unaligned", "reason": reason, "budget": 1000,
                     "backpressure": 0.93, "based_on": 7},
        "subtasks": [],
        "pending_subtasks": [],
    }
    coordinator.answers.append(httpx.Response(200, json=detail))
    result = runner.invoke(cli.app, ["checkpoints", "show", "1", "8"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "unaligned, chosen by adaptive: backpressure 0.93" in result.stdout


def test_json_output_is_the_models_json(coordinator):
    coordinator.answers.append(httpx.Response(201, json=checkpoint(3)))
    result = runner.invoke(cli.app, ["--json", "checkpoints", "trigger", "1", "--policy", "unaligned"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == checkpoint(3) | {
        "stop_job": False, "details": None, "failure_timestamp": None, "abort_reason": None, "decision": None,
        "start_delay": None,
    }
    assert json.loads(coordinator.bodies[0]) == {"policy": "unaligned"}


def test_demo_options_are_typer_options_and_its_status_is_the_exit_code(monkeypatch):
    import sys
    import types

    from cli.demo import DemoOptions

    received = []
    fake = types.ModuleType("cli.demo")
    fake.DemoOptions = DemoOptions
    fake.run = lambda options: received.append(options) or 3
    monkeypatch.setitem(sys.modules, "cli.demo", fake)
    result = runner.invoke(cli.app, ["demo", "--duration", "5", "--only", "aligned", "--no-wait"])
    assert result.exit_code == 3
    (options,) = received
    assert (options.duration, options.only, options.wait, options.coordinator) == (5.0, "aligned", False, None)
    bad = runner.invoke(cli.app, ["demo", "--only", "sideways"])
    assert bad.exit_code == 2 and "sideways" in bad.output


def test_a_run_without_a_terminal_does_not_wait_after_the_demo(monkeypatch):
    import sys
    import types

    from cli.demo import DemoOptions

    received = []
    fake = types.ModuleType("cli.demo")
    fake.DemoOptions = DemoOptions
    fake.run = lambda options: received.append(options) or 0
    monkeypatch.setitem(sys.modules, "cli.demo", fake)
    assert runner.invoke(cli.app, ["demo"]).exit_code == 0  # CliRunner's input is no terminal
    assert received[0].wait is False


def test_bench_takes_scenarios_and_options_as_typer_arguments(monkeypatch):
    import sys
    import types

    from benchmarks.cli import BenchUsageError, bench_args

    received = []
    fake = types.ModuleType("benchmarks.cli")
    fake.BenchUsageError, fake.bench_args = BenchUsageError, bench_args
    fake.main = lambda args: received.append(args) or 0
    monkeypatch.setitem(sys.modules, "benchmarks.cli", fake)
    result = runner.invoke(cli.app, ["bench", "disk", "checkpoints", "--quick", "--policies", "aligned"])
    assert result.exit_code == 0, result.output
    (args,) = received
    assert args.chosen == ["checkpoints", "disk"] and args.quick and args.policies == "aligned"
    assert args.command() == "overtake bench checkpoints disk --quick --policies aligned"
    bad = runner.invoke(cli.app, ["bench", "--policies", "sideways"])
    assert bad.exit_code == 2 and "unknown policy 'sideways'" in bad.output
    assert runner.invoke(cli.app, ["bench", "nope"]).exit_code == 2


def test_json_is_a_flag_before_or_after_the_command(coordinator):
    coordinator.answers.append(httpx.Response(201, json=checkpoint(3)))
    result = runner.invoke(cli.app, ["checkpoints", "trigger", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["id"] == 3
    helped = runner.invoke(cli.app, ["jobs", "list", "--help"], env={"COLUMNS": "120"})
    assert "--json " in helped.output and "<bool>" not in helped.output and "BOOLEAN" not in helped.output


def _page_of_checkpoints() -> dict:
    items = []
    for i in range(1, 6):
        cp = checkpoint(i) | {
            "status": "COMPLETED",
            "end_to_end_duration": 1234 * i,
            "state_size": 5 * 1024**2,
            "persisted_data": 700 * 1024,
            "processed_data": 3 * 1024**2,
            "alignment_duration": 12,
            "num_acknowledged_subtasks": 2,
            "checkpoint_type": "unaligned",
        }
        items.append(cp)
    items.append(
        checkpoint(6)
        | {
            "status": "ABORTED",
            "failure_reason": "declined: subtask count[1]: count[1] could not snapshot: the state backend on "
            "executor 7 is unavailable (connection refused)",
            "abort_reason": "declined",
        }
    )
    items.append(
        checkpoint(7)
        | {"status": "ABORTED", "failure_reason": "job_ended: the job ended as FINISHED", "abort_reason": "job_ended"}
    )
    return {"items": items, "total": 7}


@pytest.mark.parametrize("width", [60, 80, 100, 160])
def test_tables_fit_the_terminal_without_wrapping_cells(coordinator, width):
    coordinator.answers.append(httpx.Response(200, json=_page_of_checkpoints()))
    result = runner.invoke(cli.app, ["checkpoints", "list", "1"], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= width
    rows = [line for line in lines if line.startswith("│") and line[1:].strip()[:1].isdigit()]
    assert len(rows) == 7  # one line per checkpoint: no cell wrapped onto a second line
    assert "COMPLETED" in rows[0] and "NOT FINISHED" in rows[6]
    if width < 120:
        assert "left out for the width" in result.stdout
    else:
        assert "left out" not in result.stdout and "declined: subtask" in rows[5]


def test_bench_takes_scenario_numbers_and_names_and_refuses_unknown_ones_saying_which_exist(monkeypatch):
    import benchmarks.cli as bench_cli

    seen = []
    monkeypatch.setattr(bench_cli, "main", lambda args: seen.append(args.chosen) or 0)
    ok = runner.invoke(cli.app, ["bench", "8", "adaptive", "14"])
    assert ok.exit_code == 0, ok.output
    assert seen == [["inflight", "adaptive", "last-barrier"]]
    bad = runner.invoke(cli.app, ["bench", "99"])
    assert bad.exit_code == 2
    assert "unknown scenario '99'" in bad.output and "last-barrier" in bad.output


def test_the_demo_takes_its_port_while_a_stopped_servers_connections_are_in_time_wait():
    import socket

    from cli.demo import _port

    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server side closes first: its end of the connection waits in TIME_WAIT on `port`
    server.close()
    client.close()
    assert _port(port) == port


def test_without_a_terminal_tables_are_not_cut_at_80_columns(coordinator):
    coordinator.answers.append(httpx.Response(200, json=_page_of_checkpoints()))
    result = runner.invoke(cli.app, ["checkpoints", "list", "1"], env={"COLUMNS": None})  # no terminal, no COLUMNS
    assert result.exit_code == 0, result.output
    assert "left out for the width" not in result.stdout
    assert "declined: subtask count[1]: count[1] could not snapshot" in result.stdout
