"""A local coordinator as a real uvicorn subprocess: for the demo, the benchmarks and the tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCoordinator:
    def __init__(
        self,
        data_dir: Path,
        env: dict[str, str] | None = None,
        port: int | None = None,
        scheduler_tick: float = 0.02,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.env = dict(env or {})
        self.scheduler_tick = scheduler_tick
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir / "coordinator.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_token(self) -> str | None:
        return self.env.get("OVERTAKE_ADMIN_TOKEN")

    def start(self, timeout: float = 30.0) -> LocalCoordinator:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("OVERTAKE_")}
        env.update(
            {
                "OVERTAKE_DATA_DIR": str(self.data_dir),
                "OVERTAKE_SCHEDULER_TICK": str(self.scheduler_tick),
                **self.env,
            }
        )
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "app.main:create_app",
                "--factory",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
                "--no-access-log",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"coordinator exited with {self.proc.returncode}: {self.log_path.read_text()[-3000:]}"
                )
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"coordinator did not become ready: {self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, as when a machine dies."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> LocalCoordinator:
        self.stop()
        return self.start()

    def __enter__(self) -> LocalCoordinator:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
