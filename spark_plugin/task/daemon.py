"""A PySpark daemon that imports Overtake's task code before it forks Python workers.

Spark starts one daemon per executor (``python -m pyspark.daemon``) and forks every Python worker from it. A worker
of a failed task is not reused, so after a failure every task of the restarted barrier stage runs in a fresh worker,
and each one imported the runtime again (pydantic models, the HTTP client, the network layer: about half a second of
CPU each, all at once on the executor's cores). Started as the daemon instead
(``spark.python.daemon.module=spark_plugin.task.daemon``; :func:`spark_plugin.driver.session.spark_session` sets
it), this module imports them once, before the daemon forks: every worker starts with them loaded. Nothing here
starts a thread (a fork copies only the forking thread) or writes to stdout (the daemon tells Spark its port
there). A module that fails to import is left to the worker to import, and to fail there with its own message.
"""

from __future__ import annotations

import importlib
import sys

PRELOADED = (
    "spark_plugin.task.spark_task",
    "spark_plugin.task.subtask",
    "spark_plugin.network.connect",
    "spark_plugin.connectors",
)


def preload(modules: tuple[str, ...] = PRELOADED) -> list[str]:
    """Import ``modules``; the ones that failed, with why (said on stderr, never fatal)."""
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - the worker imports it again and fails with the real error
            failed.append(f"{name}: {type(e).__name__}: {e}")
    for line in failed:
        print(f"overtake daemon: not preloaded {line}", file=sys.stderr)
    return failed


if __name__ == "__main__":
    preload()
    from pyspark.daemon import manager

    manager()
