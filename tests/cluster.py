"""A Spark standalone cluster on this machine, started from the pyspark package's own launcher: a master and workers
(``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``), each its own process tree, so a test
can kill a worker with everything it runs (its JVM, its executors, their Python workers), as a lost machine would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from tests.live import free_port

START_TIMEOUT = 90.0
"""Seconds a master or a worker may take to come up on a loaded 2-core machine."""


def spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def _children() -> dict[int, list[int]]:
    """Each process's children (Linux: from /proc)."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    kids = _children()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    # the pyspark daemon moves itself into a process group of its own, so walk the tree rather than kill a group
    for p in process_tree(pid):
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


class SparkStandalone:
    """A master and its workers; ``url`` is the ``spark://`` master URL drivers connect to."""

    def __init__(self, workdir: Path, cores_per_worker: int = 2, worker_memory: str = "2g") -> None:
        self.workdir = Path(workdir)
        self.cores = cores_per_worker
        self.memory = worker_memory
        self.port = free_port()
        self.ui_port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.master: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self._logs: list = []

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOG_DIR=str(self.workdir / "logs"),
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
            SPARK_WORKER_OPTS="-Dspark.worker.cleanup.enabled=false",
        )
        return env

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "logs" / f"{name}.out", "wb")  # noqa: SIM115 - open while the process runs
        self._logs.append(log)
        return subprocess.Popen(
            [str(spark_class()), *args], stdout=log, stderr=subprocess.STDOUT, env=self._env(),
            start_new_session=True,
        )

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return json.load(r)

    def alive_workers(self) -> int:
        try:
            return sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")
        except OSError:
            return 0

    def _wait(self, what: str, ready, proc: subprocess.Popen, log_name: str) -> None:
        end = time.monotonic() + START_TIMEOUT
        while time.monotonic() < end:
            if ready():
                return
            if proc.poll() is not None:
                break
            time.sleep(0.25)
        tail = (self.workdir / "logs" / f"{log_name}.out").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the Spark {what} did not come up within {START_TIMEOUT:.0f}s; its log ends:\n{tail}")

    def start(self, workers: int = 2) -> SparkStandalone:
        self.master = self._spawn(
            "master",
            ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port),
             "--webui-port", str(self.ui_port)],
        )
        self._wait("master", self._ui_up, self.master, "master")
        for _ in range(workers):
            self.add_worker()
        return self

    def _ui_up(self) -> bool:
        try:
            self.state()
            return True
        except OSError:
            return False

    def add_worker(self) -> int:
        """Start one more worker and wait until the master counts it alive; returns its index."""
        index = len(self.workers)
        before = self.alive_workers()
        proc = self._spawn(
            f"worker-{index}",
            ["org.apache.spark.deploy.worker.Worker", self.url, "--cores", str(self.cores), "--memory", self.memory,
             "--webui-port", "0", "--work-dir", str(self.workdir / f"worker-{index}")],
        )
        self.workers.append(proc)
        self._wait(f"worker {index}", lambda: self.alive_workers() > before, proc, f"worker-{index}")
        return index

    def executor_pids(self, index: int) -> list[int]:
        """The executor JVMs worker ``index`` runs now."""
        worker = self.workers[index].pid
        out = []
        for p in process_tree(worker)[1:]:
            try:
                cmd = Path(f"/proc/{p}/cmdline").read_bytes()
            except OSError:
                continue
            if b"CoarseGrainedExecutorBackend" in cmd:
                out.append(p)
        return out

    def kill_worker(self, index: int) -> list[int]:
        """SIGKILL worker ``index`` with its executors and their Python workers, as a lost machine; returns the pids
        killed."""
        proc = self.workers[index]
        pids = process_tree(proc.pid)
        _kill_tree(proc.pid)
        proc.wait(10)
        return pids

    def stop(self) -> None:
        for proc in [*self.workers, self.master]:
            if proc is not None and proc.poll() is None:
                _kill_tree(proc.pid, signal.SIGTERM)
        for proc in [*self.workers, self.master]:
            if proc is None:
                continue
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                _kill_tree(proc.pid)
                proc.wait(5)
        for log in self._logs:
            log.close()
