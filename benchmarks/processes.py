"""Subtasks played by a benchmark as processes of their own, as Spark runs each task of a stage in a Python worker
of its own (as threads of one process they would take turns at one interpreter lock that no two subtasks of the
runtime share).

Each process gets one end of a pipe; it answers on it, or sends :func:`failed` before it dies. :func:`start` hands
the processes their ends and closes this process's copies, so a process that dies without a word is seen at once
(its pipe ends) rather than after a timeout. Processes are started with ``spawn``: the benchmark's own process may
run threads (a SparkSession's), which ``fork`` would copy mid-flight.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any


def context() -> Any:
    return multiprocessing.get_context("spawn")


def start(ctx: Any, target: Callable[..., None], args: list[tuple]) -> tuple[list[Any], list[Any]]:
    """One process per entry of ``args``, each called as ``target(*args[i], conn)``: (processes, this side's ends)."""
    pipes = [ctx.Pipe() for _ in args]
    procs = [ctx.Process(target=target, args=(*a, child), daemon=True) for a, (_, child) in zip(args, pipes, strict=True)]
    for p in procs:
        p.start()
    for _, child in pipes:
        child.close()
    return procs, [mine for mine, _ in pipes]


def failed(conn: Any, who: str, exc: BaseException) -> None:
    """Tell the measuring process why this one stops (it raises it), as the last thing this process does."""
    try:
        conn.send(("failed", f"{who}: {exc!r}"))
    except OSError:
        pass


def answer(conn: Any, who: str, timeout: float = 120.0) -> Any:
    """The next answer of a process, within ``timeout`` seconds; one it reported failing, or that died without an
    answer, raises."""
    if not conn.poll(timeout):
        raise TimeoutError(f"a {who} process did not answer within {timeout:.0f} s")
    try:
        got = conn.recv()
    except EOFError:
        raise RuntimeError(f"a {who} process exited before it answered") from None
    if isinstance(got, tuple) and got and got[0] == "failed":
        raise RuntimeError(f"a {who} process failed: {got[1]}")
    return got


def stop(procs: list[Any], timeout: float = 30.0) -> None:
    """Wait for the processes to end, each at most ``timeout`` seconds, then kill those still running."""
    for p in procs:
        p.join(timeout=timeout)
        if p.is_alive():
            p.kill()
            p.join(timeout=timeout)
