"""What Spark says of the application's executors: which run now, and which were lost, where and why. The supervisor
names a lost executor in the next attempt's reason, in its wait for task slots and in the job's failure.

    before = active_ids(sc)
    ... the barrier stage fails ...
    lost = lost_since(sc, before)          # [Executor('0', '10.0.0.7:40213', False, 'worker lost', ...)]
    describe(lost)                         # "executor 0 on 10.0.0.7:40213, worker UI 10.0.0.7:8081 (worker lost)"

Read from Spark's status store (what its REST API ``/api/v1/applications/<id>/executors`` serves, removed executors
with their ``removeReason`` included), so it works with the driver's UI off. A session without one (a stand-in in
tests, a Spark without the method) knows of no executors: every function then answers empty.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

SETTLE = 5.0
"""Seconds to wait, at most, for Spark's status store to record an executor removal its scheduler already acted on
(the store learns of it from the listener bus, a moment later)."""


@dataclass(frozen=True)
class Executor:
    id: str
    host_port: str
    active: bool
    remove_reason: str | None = None
    worker: str | None = None
    """The web UI (host:port) of the worker (standalone) or node that ran it, as its log URLs name it, if they do."""

    def __str__(self) -> str:
        where = f" on {self.host_port}" if self.host_port else ""
        return f"executor {self.id}{where}" + (f", worker UI {self.worker}" if self.worker else "")


_LOG_HOST = re.compile(r"^\w+://([^/]+)/")


def executors(sc: Any) -> list[Executor]:
    """Every executor the application had, active or removed (not the driver); [] when Spark cannot say."""
    try:
        seq = sc._jsc.sc().statusStore().executorList(False)
        out = []
        for i in range(seq.size()):
            e = seq.apply(i)
            if e.id() == "driver":
                continue
            reason = e.removeReason()
            logs = e.executorLogs()
            url = logs.get("stdout").get() if logs.contains("stdout") else ""
            m = _LOG_HOST.match(url or "")
            out.append(Executor(
                str(e.id()), str(e.hostPort() or ""), bool(e.isActive()),
                str(reason.get()) if reason.isDefined() else None, m.group(1) if m else None,
            ))
        return out
    except Exception:  # noqa: BLE001 - a stand-in session or another Spark: nothing known
        return []


def active_ids(sc: Any) -> frozenset[str]:
    """The ids of the executors that run now."""
    return frozenset(e.id for e in executors(sc) if e.active)


def scheduled_ids(sc: Any) -> frozenset[str] | None:
    """The executors Spark's scheduler counts now (it drops a lost one at once, before the status store learns it);
    None when Spark cannot say."""
    try:
        ids = sc._jsc.sc().getExecutorIds()
        return frozenset(str(ids.apply(i)) for i in range(ids.size()))
    except Exception:  # noqa: BLE001 - a stand-in session or another Spark
        return None


def lost_since(
    sc: Any, before: Collection[str], settle: float = SETTLE, sleep: Callable[[float], None] = time.sleep
) -> list[Executor]:
    """The executors of ``before`` that are gone now, with Spark's reason. When the scheduler already dropped one
    that the status store still shows active, wait up to ``settle`` seconds for the store to catch up."""
    waited = 0.0
    while True:
        gone = [e for e in executors(sc) if e.id in before and not e.active]
        scheduled = scheduled_ids(sc)
        if gone or scheduled is None or set(before) <= scheduled or waited >= settle:
            return gone
        sleep(0.2)
        waited += 0.2


def describe(lost: Collection[Executor]) -> str:
    """One line naming each lost executor, where it ran and why Spark removed it."""
    return ", ".join(f"{e}" + (f" ({e.remove_reason})" if e.remove_reason else "") for e in lost)
