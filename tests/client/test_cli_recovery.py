"""Watching a recovery from the command line: each subtask's replay in `jobs metrics`, the current attempt's
recovery phases in `jobs attempts` (a scripted coordinator answers)."""

from __future__ import annotations

import httpx
import pytest
from typer.testing import CliRunner

from cli import main as cli
from client.sync import OvertakeClient
from tests.client._fakes import NOW, Script

runner = CliRunner()
WIDE = {"COLUMNS": "250"}


@pytest.fixture
def coordinator(monkeypatch):
    script = Script()

    def client(url=None, token=None, **_):
        return OvertakeClient("http://fake:1", token=token, retries=0, transport=httpx.MockTransport(script))

    monkeypatch.setattr("cli.app.OvertakeClient", client)
    return script


def _rows(output: str) -> list[list[str]]:
    """The table's body rows, as their cells."""
    return [[c.strip() for c in line.strip().strip("│").split("│")] for line in output.splitlines() if line.startswith("│")]


def _subtask(index: int, recovery: dict | None) -> dict:
    return {
        "vertex": "agg", "subtask_index": index, "timestamp": NOW, "received_at": NOW,
        "metrics": {"records_in_per_second": 1200.0, "backpressure": 0.25, "recovery": recovery},
    }


def _recovery(replayed: int, finished_at: int | None) -> dict:
    return {
        "restored_checkpoint_id": 3, "restored_bytes": 2_621_440, "restored_buffers": 80, "replayed_bytes": replayed,
        "replay_finished_at": finished_at, "restore_ms": 40, "started_at": NOW - 100, "loop_started_at": NOW,
    }


def test_jobs_metrics_shows_each_subtasks_replay_progress_or_how_long_it_took(coordinator):
    vertex = {
        "vertex": "agg", "parallelism": 3, "reporting": 3, "records_in_per_second": 3600.0, "backpressure_max": 0.25,
        "replaying": 1, "restored_bytes": 5_242_880, "replayed_bytes": 3_879_731,
        "subtasks": [_subtask(0, _recovery(1_258_291, None)), _subtask(1, _recovery(2_621_440, NOW + 3_100)),
                     _subtask(2, None)],
    }
    coordinator.answers.append(
        httpx.Response(200, json={"job_id": 7, "attempt": 2, "now": NOW, "max_age": 10_000, "vertices": [vertex]})
    )
    result = runner.invoke(cli.app, ["jobs", "metrics", "7"], env=WIDE)
    assert result.exit_code == 0, result.output
    replay = {row[1]: row[-1] for row in _rows(result.stdout)}
    assert replay == {"0": "replay 1.2 MiB / 2.5 MiB", "1": "done 3.10 s", "2": "-"}
    assert "1 replaying" in result.stdout
    assert coordinator.requests[0].url.path == "/api/v1/jobs/7/metrics"


def test_jobs_attempts_shows_the_current_attempts_recovery_phases(coordinator):
    phases = {"detect_ms": 1_500, "relaunch_ms": 4_200, "restore_ms": 850, "replay_ms": None, "replaying": 2,
              "replay_finished_at": None}
    items = [
        {"attempt": 2, "started_at": NOW, "ended_at": None, "restored_checkpoint_id": 3, "reason": "task lost",
         "phases": phases},
        {"attempt": 1, "started_at": NOW - 60_000, "ended_at": NOW, "restored_checkpoint_id": None, "phases": None},
    ]
    coordinator.answers.append(httpx.Response(200, json={"items": items, "total": 2}))
    result = runner.invoke(cli.app, ["jobs", "attempts", "7"], env=WIDE)
    assert result.exit_code == 0, result.output
    header = next(line for line in result.stdout.splitlines() if "detect" in line)
    names = [c.strip() for c in header.strip().strip("┃").split("┃")]
    phase_at = names.index("detect")
    assert names[phase_at : phase_at + 4] == ["detect", "relaunch", "restore", "replay"]
    current, first = _rows(result.stdout)
    assert current[phase_at : phase_at + 4] == ["1.50 s", "4.20 s", "850 ms", "2 replaying"]
    assert first[phase_at : phase_at + 4] == ["-", "-", "-", "-"]

    phases.update(replay_ms=12_340, replaying=0, replay_finished_at=NOW + 20_000)
    coordinator.answers.append(httpx.Response(200, json={"items": items, "total": 2}))
    result = runner.invoke(cli.app, ["jobs", "attempts", "7"], env=WIDE)
    assert _rows(result.stdout)[0][phase_at + 3] == "12.34 s"
