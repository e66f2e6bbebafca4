"""A load generator that is not the bottleneck: worker processes, each driving many keep-alive HTTP/1.1
connections with pre-built requests over raw asyncio streams (no HTTP client library on the hot path)."""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import time
from collections import Counter
from dataclasses import dataclass, field


def build_request(
    method: str, path: str, host: str, body: object | None = None, headers: dict | None = None
) -> bytes:
    payload = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(payload)}"]
    if body is not None:
        lines.append("Content-Type: application/json")
    for k, v in (headers or {}).items():
        lines.append(f"{k}: {v}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


@dataclass
class RunResult:
    sent: int = 0
    statuses: Counter = field(default_factory=Counter)
    started: float = 0.0
    finished: float = 0.0
    last_sent: float = 0.0
    latencies: list[float] = field(default_factory=list)

    def merge(self, other: RunResult) -> RunResult:
        self.sent += other.sent
        self.statuses.update(other.statuses)
        self.started = min(self.started or other.started, other.started)
        self.finished = max(self.finished, other.finished)
        self.last_sent = max(self.last_sent, other.last_sent)
        self.latencies.extend(other.latencies)
        return self


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
            break
    if length:
        await reader.readexactly(length)
    return status


async def _run(host: str, port: int, requests: list[bytes], concurrency: int, pool: list) -> RunResult:
    result = RunResult()
    it = iter(requests)
    while len(pool) < concurrency:
        pool.append(await asyncio.open_connection(host, port))

    async def drive(conn):
        reader, writer = conn
        for req in it:
            t0 = time.time()
            writer.write(req)
            result.last_sent = max(result.last_sent, t0)
            status = await _read_response(reader)
            result.latencies.append(time.time() - t0)
            result.statuses[status] += 1
            result.sent += 1

    result.started = time.time()
    await asyncio.gather(*(drive(c) for c in pool[:concurrency]))
    result.finished = time.time()
    return result


def _worker(pipe, host: str, port: int, concurrency: int) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    loop = asyncio.new_event_loop()
    pool: list = []
    while True:
        job = pipe.recv()
        if job is None:
            break
        pipe.send(loop.run_until_complete(_run(host, port, job, concurrency, pool)))


class LoadGenerator:
    """`processes` workers with `concurrency` connections each; `run(requests)` splits them across workers."""

    def __init__(self, host: str, port: int, processes: int = 2, concurrency: int = 32) -> None:
        ctx = mp.get_context("spawn")
        self._pipes = []
        self._procs = []
        for _ in range(processes):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(child, host, port, concurrency), daemon=True)
            p.start()
            self._pipes.append(parent)
            self._procs.append(p)

    def run(self, requests: list[bytes]) -> RunResult:
        n = len(self._pipes)
        for i, pipe in enumerate(self._pipes):
            pipe.send(requests[i::n])
        total = RunResult()
        for pipe in self._pipes:
            total.merge(pipe.recv())
        return total

    def close(self) -> None:
        for pipe in self._pipes:
            try:
                pipe.send(None)
            except (BrokenPipeError, OSError):
                pass
        for p in self._procs:
            p.join(5)
            if p.is_alive():
                p.kill()

    def __enter__(self) -> LoadGenerator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
