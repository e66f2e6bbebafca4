"""Where the coordinator's time goes on the control path: a profile of one coordinator serving triggers and acks.

``python -m benchmarks.profile_control`` starts a coordinator on PostgreSQL (state written straight into the store),
plays a job of two subtasks itself (no Spark: trigger a checkpoint, read its write target, each subtask writes its
state and acks; one checkpoint at a time, so every request meets an idle coordinator), and records the coordinator
with py-spy meanwhile. It prints the request latencies, the share of the run the coordinator was on a CPU, and the
frames that took the most of it, so a missed control-path target can be said in terms of what the coordinator does.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.acks import new_pg_database
from benchmarks.control import one_vertex_job

GROUPS = {
    "PostgreSQL driver (asyncpg: bind, execute, fetch)": "asyncpg/",
    "SQLAlchemy (sessions, statements)": "sqlalchemy/",
    "HTTP and ASGI (uvicorn, Starlette, FastAPI, the guards)": ("uvicorn/", "starlette/", "fastapi/", "api/guards"),
    "applying acks (AckCommitter._apply)": "AckCommitter._apply ",
    "completing checkpoints (complete_checkpoint)": "complete_checkpoint ",
    "cleaning subsumed checkpoints (Cleaner)": "Cleaner.",
    "the scheduler's own ticks": "Scheduler._run ",
    "JSON and pydantic": ("json/", "pydantic"),
    "the event loop's own work (asyncio: polling, scheduling callbacks)": "asyncio/",
}


def _shares(raw: Path) -> tuple[int, dict[str, float], list[tuple[str, float]]]:
    """Samples in all, the share of samples under each group, the frames most often on top."""
    total = 0
    groups: collections.Counter = collections.Counter()
    top: collections.Counter = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        count = int(n)
        total += count
        frames = stack.split(";")
        top[re.sub(r":\d+\)$", ")", frames[-1])] += count
        groups[_group(frames)] += count
    names = [*GROUPS, OTHER]
    return total, {k: groups[k] / max(total, 1) for k in names}, [(f, c / max(total, 1)) for f, c in top.most_common(8)]


OTHER = "elsewhere (worker threads, the rest)"


def _group(frames: list[str]) -> str:
    """The group of the innermost frame that belongs to one: each sample is counted once, where its time went."""
    for frame in reversed(frames):
        for name, needles in GROUPS.items():
            if any(x in frame for x in ((needles,) if isinstance(needles, str) else needles)):
                return name
    return OTHER


def run(pg_admin_url: str, rounds: int, state_bytes: int, rate: int, out: Path) -> str:
    from app.local import LocalCoordinator
    from client.sync import OvertakeClient
    from contract.models import EventType, WriteTarget
    from spark_plugin.task.state_store import StateWriter

    db, drop = new_pg_database(pg_admin_url)
    lines = []
    with tempfile.TemporaryDirectory(prefix="overtake-profile-") as tmp:
        c = LocalCoordinator(Path(tmp), {"OVERTAKE_DATABASE_URL": db, "OVERTAKE_LOG_LEVEL": "WARNING",
                                         "OVERTAKE_STATE_WRITES": "direct"}).start()
        spy = None
        try:
            with OvertakeClient(c.url) as admin:
                job, attempt = one_vertex_job(admin, "profile", 2)
                task = OvertakeClient(c.url, attempt.task_token)
                writers = [StateWriter(f"v-{i}.state") for i in range(2)]
                took: dict[str, list[float]] = collections.defaultdict(list)
                after = None
                for r in range(rounds + 5):
                    if r == 5:  # warmed up
                        spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-p",
                                                str(c.proc.pid), "-o", str(out), "-f", "raw", "-r", str(rate),
                                                "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        time.sleep(1.0)
                        started = time.perf_counter()
                    t = time.perf_counter()
                    cp = admin.trigger_checkpoint(job.id).id
                    took["trigger"].append(time.perf_counter() - t)
                    target = None
                    for ev in admin.event_history(job.id, after=after, limit=1000):
                        after = ev.id
                        if ev.type == EventType.checkpoint_triggered and ev.data["checkpoint_id"] == cp:
                            target = WriteTarget.model_validate(ev.data["target"])
                    for i, name in enumerate(("ack", "ack that completes the checkpoint")):
                        written = writers[i].write(target, b"o" * 128, os.urandom(state_bytes))
                        t = time.perf_counter()
                        task.ack(job.id, cp, {"attempt": attempt.attempt, "vertex": "v", "subtask_index": i,
                                              "written": written.model_dump(mode="json"),
                                              "metrics": {"unaligned": True}})
                        took[name].append(time.perf_counter() - t)
                wall = time.perf_counter() - started
                task.close()
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
        finally:
            if spy is not None and spy.poll() is None:
                spy.kill()
            c.stop()
            drop()
    total, groups, top = _shares(out)
    lines.append(f"{rounds} checkpoints of 2 subtasks, one at a time, {state_bytes:,} B of state per subtask:")
    for name, xs in took.items():
        xs = xs[5:]
        lines.append(f"  {name}: p50 {statistics.median(xs) * 1000:.1f} ms")
    lines.append(f"the coordinator was on a CPU for {total / rate:.1f} s of the {wall:.1f} s "
                 f"({total / rate / wall:.0%}); {total / rate / rounds * 1000:.1f} ms of CPU per checkpoint "
                 "(one trigger, one read of events, two acks)")
    lines.append("where the coordinator's CPU samples were (each counted once, by its innermost known frame):")
    lines += [f"  {share:5.1%}  {name}" for name, share in groups.items()]
    lines.append("frames most often on top:")
    lines += [f"  {share:5.1%}  {frame}" for frame, share in top]
    lines.append(f"collapsed stacks: {out}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres", help="admin URL")
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--state-bytes", type=int, default=16 * 1024)
    p.add_argument("--rate", type=int, default=1000, help="py-spy samples per second")
    p.add_argument("--out", type=Path, default=Path("bench-results") / "control-profile.txt")
    args = p.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(run(args.postgres, args.rounds, args.state_bytes, args.rate, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
