"""Coordinator ack throughput on PostgreSQL through real HTTP, against the same server's no-database ceiling.

One job of N subtasks (default 2,000); for each of several checkpoints every subtask acks once. Reported:
durable acks/s (each answered only after its commit), the same server's requests/s on /healthz (no database
work), their ratio, the same with batch acks, the same with group commit disabled (one transaction per ack),
and the time from the last ack sent to the checkpoint.completed event.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from app.local import LocalCoordinator
from benchmarks.loadgen import LoadGenerator, build_request


@dataclass
class AckBenchResult:
    subtasks: int
    checkpoints: int
    processes: int
    concurrency: int
    ceiling_rps: float = 0.0
    acks_per_s: float = 0.0
    batch_acks_per_s: float = 0.0
    batch_size: int = 0
    no_group_commit_acks_per_s: float = 0.0
    completion_latency_ms: list[float] = field(default_factory=list)
    state_bytes: int = 0
    state_acks_per_s: float = 0.0
    state_all_recorded_ms: list[float] = field(default_factory=list)
    """Acks naming state the subtasks wrote into the store: first ack sent -> checkpoint.completed, per checkpoint."""
    relay_subtasks_per_host: int = 0
    state_relay_acks_per_s: float = 0.0
    state_relay_recorded_ms: list[float] = field(default_factory=list)
    """The same acks as the runtime sends them by default: each host's relay sends its subtasks' acks together,
    one batch request per host of ``relay_subtasks_per_host`` subtasks."""
    errors: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.acks_per_s / self.ceiling_rps if self.ceiling_rps else 0.0

    def completion_p50(self) -> float:
        return statistics.median(self.completion_latency_ms) if self.completion_latency_ms else float("nan")

    def state_recorded_p50(self) -> float:
        return statistics.median(self.state_all_recorded_ms) if self.state_all_recorded_ms else float("nan")

    def state_relay_recorded_p50(self) -> float:
        return statistics.median(self.state_relay_recorded_ms) if self.state_relay_recorded_ms else float("nan")

    def markdown(self) -> str:
        def pct(x):
            return f"{x * 100:.0f}%"

        rows = [
            "| measurement | value | vs /healthz |",
            "| --- | ---: | ---: |",
            f"| /healthz, no database work (ceiling) | {self.ceiling_rps:,.0f} req/s | 100% |",
            f"| durable acks, one per request (group commit) | {self.acks_per_s:,.0f} acks/s | {pct(self.ratio)} |",
            f"| durable acks, batch route ({self.batch_size} per request) | {self.batch_acks_per_s:,.0f} acks/s | "
            f"{pct(self.batch_acks_per_s / self.ceiling_rps if self.ceiling_rps else 0)} |",
            f"| durable acks, one transaction per ack (group commit off) | {self.no_group_commit_acks_per_s:,.0f} acks/s | "
            f"{pct(self.no_group_commit_acks_per_s / self.ceiling_rps if self.ceiling_rps else 0)} |",
            f"| last ack sent → checkpoint.completed event, p50 | {self.completion_p50():.1f} ms | |",
        ]
        if self.state_all_recorded_ms:
            rows += [
                f"| durable acks naming written state ({self.state_bytes:,} B per subtask, a stat each) | "
                f"{self.state_acks_per_s:,.0f} acks/s | {pct(self.state_acks_per_s / self.ceiling_rps if self.ceiling_rps else 0)} |",
                f"| {self.subtasks:,} subtasks with state: first ack sent → checkpoint.completed, p50 | "
                f"{self.state_recorded_p50():.0f} ms | |",
            ]
        if self.state_relay_recorded_ms:
            rows += [
                f"| the same through host relays ({self.relay_subtasks_per_host} subtasks per host, one batch request "
                f"each) | {self.state_relay_acks_per_s:,.0f} acks/s | "
                f"{pct(self.state_relay_acks_per_s / self.ceiling_rps if self.ceiling_rps else 0)} |",
                f"| {self.subtasks:,} subtasks with state through host relays: first ack sent → "
                f"checkpoint.completed, p50 | {self.state_relay_recorded_p50():.0f} ms | |",
            ]
        return "\n".join(rows)


class _Completions:
    """Follows the job's event stream and records when each checkpoint.completed arrives."""

    def __init__(self, url: str, job_id: int) -> None:
        self.times: dict[int, float] = {}
        self.targets: dict[int, dict | None] = {}
        self._cv = threading.Condition()
        self._stop = False
        self._t = threading.Thread(target=self._run, args=(url, job_id), daemon=True)
        self._t.start()

    def _run(self, url: str, job_id: int) -> None:
        try:
            self._follow(url, job_id)
        except httpx.HTTPError:
            if not self._stop:
                raise

    def _follow(self, url: str, job_id: int) -> None:
        with httpx.stream("GET", f"{url}/api/v1/jobs/{job_id}/events", timeout=None) as r:
            for line in r.iter_lines():
                if self._stop:
                    return
                if line.startswith("data:"):
                    e = json.loads(line[5:])
                    if e["type"] == "checkpoint.completed":
                        with self._cv:
                            self.times[e["data"]["checkpoint_id"]] = time.time()
                            self._cv.notify_all()
                    elif e["type"] == "checkpoint.triggered":
                        with self._cv:
                            self.targets[e["data"]["checkpoint_id"]] = e["data"].get("target")
                            self._cv.notify_all()

    def wait(self, cp: int, timeout: float = 60) -> float:
        with self._cv:
            if not self._cv.wait_for(lambda: cp in self.times, timeout):
                raise TimeoutError(f"checkpoint {cp} did not complete")
            return self.times[cp]

    def target(self, cp: int, timeout: float = 30) -> dict:
        with self._cv:
            if not self._cv.wait_for(lambda: cp in self.targets, timeout):
                raise TimeoutError(f"checkpoint {cp}'s trigger event did not arrive")
        target = self.targets[cp]
        if target is None or not target["url"].startswith("file://"):
            raise RuntimeError(f"checkpoint {cp} has no file:// write target ({target}); run the coordinator with "
                               "OVERTAKE_STATE_WRITES=direct and a file:// store")
        return target

    def stop(self) -> None:
        self._stop = True


def _write_states(target: dict, subtasks: int, state_bytes: int) -> list[dict]:
    """What each subtask would have written before its ack: one object under the checkpoint's prefix (written
    without fsync: only the ack path is measured here), and the handle its ack names."""
    import hashlib
    import os
    from urllib.parse import unquote, urlparse

    root = Path(unquote(urlparse(target["url"]).path))
    directory = root / target["prefix"]
    directory.mkdir(parents=True, exist_ok=True)
    op, ch = os.urandom(128), os.urandom(max(1, state_bytes - 128))
    handles = []
    for i in range(subtasks):
        name = f"src-{i}-a1.state"
        (directory / name).write_bytes(op + ch)
        handles.append({
            "key": target["prefix"] + name, "size": len(op) + len(ch), "operator_size": len(op),
            "operator_sha256": hashlib.sha256(op).hexdigest(), "channel_sha256": hashlib.sha256(ch).hexdigest(),
        })
    return handles


def _register(url: str, subtasks: int) -> int:
    body = {
        "name": "ack-bench",
        "graph": {
            "vertices": [{"id": "src", "parallelism": subtasks, "max_parallelism": max(128, subtasks)}]
        },
        "checkpoint": {"max_concurrent": 1, "timeout": 600_000, "retained": 1, "policy": "unaligned"},
    }
    job = httpx.post(f"{url}/api/v1/jobs", json=body, timeout=30).raise_for_status().json()
    httpx.post(f"{url}/api/v1/jobs/{job['id']}/attempts", json={}, timeout=30).raise_for_status()
    return job["id"]


def _ack_body(i: int) -> dict:
    return {
        "attempt": 1,
        "vertex": "src",
        "subtask_index": i,
        "metrics": {
            "sync_duration": 1,
            "async_duration": 3,
            "alignment_duration": 0,
            "processed_data": 4096,
            "persisted_data": 1024,
            "unaligned": True,
        },
        "source_offsets": {f"split-{i}": 12345},
    }


def _measure_acks(
    url: str, port: int, subtasks: int, checkpoints: int, processes: int, concurrency: int, batch: int, result,
    state_bytes: int = 0,
) -> tuple[float, list[float], dict]:
    """Acks/s, and per checkpoint the latency to its checkpoint.completed event: from the last ack sent, or with
    ``state_bytes`` (acks naming state written into the store) from the first."""
    job = _register(url, subtasks)
    host = f"127.0.0.1:{port}"
    completions = _Completions(url, job)
    time.sleep(0.3)
    elapsed = 0.0
    acked = 0
    latencies = []
    errors: dict = {}
    with LoadGenerator("127.0.0.1", port, processes, concurrency) as lg:
        for _ in range(checkpoints):
            cp = (
                httpx.post(f"{url}/api/v1/jobs/{job}/checkpoints", json={}, timeout=30)
                .raise_for_status()
                .json()["id"]
            )
            if state_bytes and batch > 1:  # each host's relay: one batch request for its subtasks
                handles = _write_states(completions.target(cp), subtasks, state_bytes)
                path = f"/api/v1/jobs/{job}/checkpoints/{cp}/acks/batch"
                reqs = [
                    build_request("POST", path, host, {"acks": [
                        {**_ack_body(i), "written": handles[i]} for i in range(s, min(s + batch, subtasks))
                    ]})
                    for s in range(0, subtasks, batch)
                ]
            elif state_bytes:
                handles = _write_states(completions.target(cp), subtasks, state_bytes)
                path = f"/api/v1/jobs/{job}/checkpoints/{cp}/acks"
                reqs = [
                    build_request("POST", path, host, {**_ack_body(i), "written": handles[i]})
                    for i in range(subtasks)
                ]
            elif batch <= 1:
                path = f"/api/v1/jobs/{job}/checkpoints/{cp}/acks"
                reqs = [build_request("POST", path, host, _ack_body(i)) for i in range(subtasks)]
            else:
                path = f"/api/v1/jobs/{job}/checkpoints/{cp}/acks/batch"
                reqs = [
                    build_request(
                        "POST",
                        path,
                        host,
                        {"acks": [_ack_body(i) for i in range(s, min(s + batch, subtasks))]},
                    )
                    for s in range(0, subtasks, batch)
                ]
            run = lg.run(reqs)
            for status, n in run.statuses.items():
                if status != 200:
                    errors[status] = errors.get(status, 0) + n
            elapsed += run.finished - run.started
            acked += subtasks
            done = completions.wait(cp)
            latencies.append(max(0.0, (done - (run.started if state_bytes else run.last_sent)) * 1000))
    completions.stop()
    return acked / elapsed, latencies, errors


def _measure_ceiling(port: int, n: int, processes: int, concurrency: int) -> float:
    req = build_request("GET", "/healthz", f"127.0.0.1:{port}")
    with LoadGenerator("127.0.0.1", port, processes, concurrency) as lg:
        lg.run([req] * 2000)  # warm-up
        run = lg.run([req] * n)
    return run.sent / (run.finished - run.started)


def new_pg_database(admin_url: str) -> tuple[str, callable]:
    import psycopg

    name = f"overtake_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    base = admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://", 1)
    return f"{base}/{name}", drop


def run(
    pg_admin_url: str = "postgresql://postgres@127.0.0.1:5432/postgres",
    subtasks: int = 2000,
    checkpoints: int = 10,
    processes: int = 2,
    concurrency: int = 32,
    batch_size: int = 20,
    log=print,
    state_bytes: int = 16 * 1024,
) -> AckBenchResult:
    result = AckBenchResult(
        subtasks=subtasks, checkpoints=checkpoints, processes=processes, concurrency=concurrency
    )
    result.batch_size = batch_size
    with tempfile.TemporaryDirectory(prefix="overtake-bench-") as tmp:
        for label, extra in (
            ("group commit", {}),
            ("one transaction per ack", {"OVERTAKE_ACK_BATCH_MAX": "1"}),
        ):
            db_url, drop = new_pg_database(pg_admin_url)
            env = {"OVERTAKE_DATABASE_URL": db_url, "OVERTAKE_LOG_LEVEL": "WARNING", **extra}
            try:
                with LocalCoordinator(Path(tmp) / label.replace(" ", "-"), env, scheduler_tick=0.05) as coord:
                    if not extra:
                        log("measuring the /healthz ceiling")
                        result.ceiling_rps = _measure_ceiling(
                            coord.port, subtasks * checkpoints, processes, concurrency
                        )
                        log(f"acks with {label}: {checkpoints} checkpoints x {subtasks} subtasks")
                        result.acks_per_s, result.completion_latency_ms, result.errors = _measure_acks(
                            coord.url, coord.port, subtasks, checkpoints, processes, concurrency, 1, result
                        )
                        if state_bytes:
                            log(f"acks naming state written into the store ({state_bytes:,} B per subtask)")
                            result.state_bytes = state_bytes
                            result.state_acks_per_s, result.state_all_recorded_ms, _ = _measure_acks(
                                coord.url, coord.port, subtasks, checkpoints, processes, concurrency, 1, result,
                                state_bytes=state_bytes,
                            )
                            per_host = 8
                            log(f"the same through host relays ({per_host} subtasks per host)")
                            result.relay_subtasks_per_host = per_host
                            result.state_relay_acks_per_s, result.state_relay_recorded_ms, _ = _measure_acks(
                                coord.url, coord.port, subtasks, checkpoints, processes, concurrency, per_host,
                                result, state_bytes=state_bytes,
                            )
                        log(f"batch acks ({batch_size} per request)")
                        result.batch_acks_per_s, _, _ = _measure_acks(
                            coord.url,
                            coord.port,
                            subtasks,
                            checkpoints,
                            processes,
                            concurrency,
                            batch_size,
                            result,
                        )
                    else:
                        log(f"acks with {label}")
                        result.no_group_commit_acks_per_s, _, _ = _measure_acks(
                            coord.url,
                            coord.port,
                            subtasks,
                            max(2, checkpoints // 3),
                            processes,
                            concurrency,
                            1,
                            result,
                        )
            finally:
                drop()
    return result


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="overtake bench acks", description=__doc__)
    p.add_argument(
        "--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres", help="admin URL (psycopg)"
    )
    p.add_argument("--subtasks", type=int, default=2000)
    p.add_argument("--checkpoints", type=int, default=10)
    p.add_argument("--processes", type=int, default=2, help="load generator processes")
    p.add_argument("--concurrency", type=int, default=32, help="connections per load generator process")
    p.add_argument("--batch-size", type=int, default=20)
    p.add_argument("--state-bytes", type=int, default=16 * 1024,
                   help="state per subtask in the run whose acks name written state (0: skip that run)")
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    args = p.parse_args(argv)
    r = run(args.postgres, args.subtasks, args.checkpoints, args.processes, args.concurrency, args.batch_size,
            state_bytes=args.state_bytes)
    args.out.mkdir(parents=True, exist_ok=True)
    text = "## Coordinator ack throughput (PostgreSQL, real HTTP)\n\n" + r.markdown() + "\n"
    (args.out / "acks.md").write_text(text)
    (args.out / "acks.json").write_text(
        json.dumps({**asdict(r), "ratio": r.ratio, "completion_p50_ms": r.completion_p50()}, indent=2)
    )
    print(text)
    if r.errors:
        print(f"non-200 responses: {r.errors}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
