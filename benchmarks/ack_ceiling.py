"""Durable acks per second against the same server's no-database ceiling, side by side in one run, measured by an
independent load generator (wrk, with `benchmarks/lua/ack.lua`) at several connection counts, on PostgreSQL.

For each connection count, in alternating rounds: `wrk` on GET /healthz (no database work: the ceiling), then
`wrk` on the ack route, every request a different subtask's ack (each answered only after its commit). The
ratio per round is acks/s over the ceiling of the round before it; the median round is reported.

    python -m benchmarks.ack_ceiling --connections 8,32,128 --seconds 5 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from app.local import LocalCoordinator
from benchmarks.acks import new_pg_database

LUA = Path(__file__).parent / "lua" / "ack.lua"
VERTICES, PARALLELISM, CHECKPOINTS = 4, 8192, 4  # 131,072 different acks per job


@dataclass
class Level:
    connections: int
    ceiling: list[float] = field(default_factory=list)
    acks: list[float] = field(default_factory=list)
    errors: int = 0

    @property
    def ratios(self) -> list[float]:
        return [a / c for a, c in zip(self.acks, self.ceiling, strict=True) if c]

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios) if self.ratios else 0.0


def wrk(url: str, path: str, connections: int, seconds: float, script: Path | None = None, args=()) -> tuple[float, int]:
    """requests/s and the count of non-2xx answers and socket errors."""
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency"]
    if script is not None:
        cmd += ["-s", str(script)]
    cmd.append(url + path)
    if args:
        cmd += ["--", *map(str, args)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    rps = float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))
    bad = sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses:\s+(\d+)", out))
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if sock:
        bad += sum(int(x) for x in sock.groups())
    if bad:
        print(f"wrk {path} at {connections} connections: {' '.join(out.split())[-300:]}")
    return rps, bad


def _ack_job(url: str) -> tuple[int, list[int]]:
    vertices = [{"id": f"v{i}", "parallelism": PARALLELISM, "max_parallelism": PARALLELISM} for i in range(VERTICES)]
    body = {"name": "ack-ceiling", "graph": {"vertices": vertices},
            "checkpoint": {"max_concurrent": CHECKPOINTS, "timeout": 3_600_000, "policy": "unaligned"}}
    job = httpx.post(f"{url}/api/v1/jobs", json=body, timeout=60).raise_for_status().json()["id"]
    httpx.post(f"{url}/api/v1/jobs/{job}/attempts", json={}, timeout=60).raise_for_status()
    cps = [httpx.post(f"{url}/api/v1/jobs/{job}/checkpoints", json={}, timeout=60).raise_for_status().json()["id"]
           for _ in range(CHECKPOINTS)]
    return job, cps


def run(pg_admin_url: str, connections: list[int], seconds: float, rounds: int, log=print) -> list[Level]:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install wrk): it is the independent load generator here")
    levels = [Level(c) for c in connections]
    with tempfile.TemporaryDirectory(prefix="overtake-ack-ceiling-") as tmp:
        db_url, drop = new_pg_database(pg_admin_url)
        env = {"OVERTAKE_DATABASE_URL": db_url, "OVERTAKE_LOG_LEVEL": "WARNING", "OVERTAKE_SCHEDULER_ENABLED": "false"}
        try:
            with LocalCoordinator(Path(tmp) / "coordinator", env) as coord:
                wrk(coord.url, "/healthz", 8, 1)  # warm-up
                for r in range(rounds):
                    for level in levels:
                        ceiling, bad = wrk(coord.url, "/healthz", level.connections, seconds)
                        job, cps = _ack_job(coord.url)
                        args = (job, ",".join(map(str, cps)), VERTICES, PARALLELISM, 1)
                        acks, bad_acks = wrk(coord.url, f"/api/v1/jobs/{job}/checkpoints/{cps[0]}/acks",
                                             level.connections, seconds, LUA, args)
                        level.ceiling.append(ceiling)
                        level.acks.append(acks)
                        level.errors += bad + bad_acks
                        log(f"round {r + 1}, {level.connections} connections: /healthz {ceiling:,.0f} req/s, "
                            f"acks {acks:,.0f}/s, {acks / ceiling:.2f}" + (f", {bad + bad_acks} errors" if bad + bad_acks else ""))
        finally:
            drop()
    return levels


def markdown(levels: list[Level]) -> str:
    rows = ["| connections | /healthz (ceiling) | durable acks | acks / ceiling (median round) | rounds | errors |",
            "| ---: | ---: | ---: | ---: | --- | ---: |"]
    for lv in levels:
        rows.append(
            f"| {lv.connections} | {statistics.median(lv.ceiling):,.0f} req/s | {statistics.median(lv.acks):,.0f}/s "
            f"| {lv.ratio:.2f} | {', '.join(f'{x:.2f}' for x in lv.ratios)} | {lv.errors} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="overtake bench acks", description=__doc__.split("\n\n")[0])
    p.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres", help="admin URL (psycopg)")
    p.add_argument("--connections", default="8,32,128")
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    args = p.parse_args(argv)
    levels = run(args.postgres, [int(c) for c in args.connections.split(",")], args.seconds, args.rounds)
    text = "## Durable acks against the no-database ceiling (wrk, PostgreSQL)\n\n" + markdown(levels) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ack-ceiling.md").write_text(text)
    (args.out / "ack-ceiling.json").write_text(json.dumps([asdict(lv) | {"ratio": lv.ratio} for lv in levels], indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
