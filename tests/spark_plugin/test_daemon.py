"""The executors' PySpark daemon imports Overtake's task code before it forks workers (``spark_plugin.task.daemon``):
a fresh worker of a restarted stage starts with it loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_plugin.task.daemon import PRELOADED

ROOT = Path(__file__).resolve().parents[2]


def test_a_module_that_fails_to_import_is_named_on_stderr_and_nothing_is_written_to_stdout():
    # the daemon tells Spark its port on stdout: preloading must write nothing there, and must not stop the daemon
    run = subprocess.run(
        [sys.executable, "-c", "from spark_plugin.task.daemon import preload; "
         "import sys; sys.exit(len(preload(('json', 'overtake_no_such_module'))))"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 1 and run.stdout == ""
    assert "not preloaded overtake_no_such_module: ModuleNotFoundError" in run.stderr


def test_preloading_starts_no_thread_and_loads_the_task_code():
    run = subprocess.run(
        [sys.executable, "-c", "import sys, threading; from spark_plugin.task.daemon import preload, PRELOADED; "
         "preload(); print(threading.active_count(), all(m in sys.modules for m in PRELOADED))"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert run.stdout.split() == ["1", "True"], run.stderr  # a fork copies only the forking thread


def _worker_view(_):
    import os
    import sys

    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        parent = f.read().replace(b"\0", b" ").decode()
    return parent, [m for m in PRELOADED if m in sys.modules]


@pytest.mark.spark
@pytest.mark.skipif(not os.path.exists("/proc/self/cmdline"), reason="reads the worker's parent from /proc")
def test_the_test_sessions_workers_are_forked_from_the_preloading_daemon(spark):
    parent, loaded = spark.sparkContext.parallelize([0], 1).map(_worker_view).collect()[0]
    assert "spark_plugin.task.daemon" in parent, parent
    assert loaded == list(PRELOADED)
