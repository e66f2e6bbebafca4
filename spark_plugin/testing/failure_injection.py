"""Failure injection for tests and benchmarks: Spark tasks announce their Python worker's pid so it can be killed.

Every Spark task of a pipeline that maps through :class:`Announce` (or calls :func:`announce`) writes its worker's
pid to ``pid_dir/<stage>-<partition>.pid`` once per task; the stage id grows with every attempt, so the newest
files name the running subtasks' processes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_announced: dict[str, int] = {}


def announce(pid_dir: str) -> None:
    """Write this worker's pid for the current Spark task (once per task)."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    name = f"{ctx.stageId():06d}-{ctx.partitionId()}.pid"
    if _announced.get(name) != os.getpid():
        path = Path(pid_dir) / name
        tmp = path.with_suffix(".tmp")
        tmp.write_text(str(os.getpid()))
        os.replace(tmp, path)
        _announced[name] = os.getpid()


class Announce:
    """A pass-through map that announces its task's pid."""

    def __init__(self, pid_dir: str) -> None:
        self.pid_dir = pid_dir

    def __call__(self, record):
        announce(self.pid_dir)
        return record


class SlowCountPerKey:
    """The keyed stage of the failure tests and benchmarks: slow (``delay`` seconds per record, the backpressure),
    counts per key, announces its task's pid. Emits ``(key, seq, n)``, with ``stamp`` also the processing time."""

    def __init__(self, pid_dir: str, delay: float = 0.0003, stamp: bool = False) -> None:
        self.pid_dir = pid_dir
        self.delay = delay
        self.stamp = stamp

    def __call__(self, key, record, state):
        announce(self.pid_dir)
        time.sleep(self.delay)
        n = (state.value() or 0) + 1
        state.update(n)
        return [(key, record[1], n, time.time()) if self.stamp else (key, record[1], n)]
