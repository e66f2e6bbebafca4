"""`overtake serve` and `overtake db upgrade`: the commands that run the coordinator's own code."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from typer.testing import CliRunner

from cli.main import app
from tests.live import free_port


def _env(data_dir) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERTAKE_")}
    env["OVERTAKE_DATA_DIR"] = str(data_dir)
    return env


def test_db_upgrade_creates_the_schema_in_the_configured_database(tmp_path, monkeypatch):
    for name in [k for k in os.environ if k.startswith("OVERTAKE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OVERTAKE_DATA_DIR", str(tmp_path))
    result = CliRunner().invoke(app, ["db", "upgrade"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("database sqlite+aiosqlite:///")
    assert result.stdout.rstrip().endswith("is up to date")
    assert str(tmp_path) in result.stdout
    assert any(p.suffix == ".db" or p.name.endswith(".sqlite") for p in tmp_path.iterdir())


def test_serve_runs_a_coordinator_that_answers_the_sdk(tmp_path):
    from client.sync import OvertakeClient

    port = free_port()
    cmd = [sys.executable, "-c", "from cli.main import main; main()", "serve", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        with OvertakeClient(f"http://127.0.0.1:{port}", retries=12, backoff=0.1) as c:
            assert c.list_jobs().total == 0
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, -signal.SIGINT)


def test_a_port_in_use_is_reported_without_a_traceback(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cmd = [sys.executable, "-c", "from cli.main import main; main()", "serve", "--port", str(port)]
        done = subprocess.run(cmd, env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert str(port) in done.stderr or "address already in use" in done.stderr.lower()


def test_serve_takes_the_data_dir_the_demo_prints_and_dev_sh_passes_it_on(tmp_path, monkeypatch):
    """The demo's "look at this run later" line is a command that works from a fresh clone: `./dev.sh serve`
    with the demo's data dir (the virtualenv's `overtake` is on no PATH)."""
    import re
    from pathlib import Path

    import uvicorn

    from cli.demo import later_command

    later = later_command(Path(".overtake/demo"))
    assert later.startswith("./dev.sh serve ")
    dev_sh = (Path(__file__).parents[2] / "dev.sh").read_text()
    assert re.search(r'serve\)\n\s+ensure_python\n\s+exec "\$VENV/bin/overtake" serve "\$@"', dev_sh)
    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: seen.update(data_dir=os.environ.get("OVERTAKE_DATA_DIR")))
    monkeypatch.setattr("cli.main._announce_when_ready", lambda *a: None)
    monkeypatch.delenv("OVERTAKE_DATA_DIR", raising=False)
    args = later.split()[1:]  # what dev.sh hands to `overtake`
    args[args.index(".overtake/demo")] = str(tmp_path / "demo")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert seen["data_dir"] == str(tmp_path / "demo")
