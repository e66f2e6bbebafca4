"""Overtake beside PyFlink 2.3 on the FLIP-76 backpressured job, by turns in one run (``python -m
benchmarks.pyflink_side``): for each depth, Overtake's run of ``overtake bench`` scenario 1 with unaligned
checkpoints (``benchmarks.flip76``: a sequence source, ``depth`` keyed stages sleeping ``record_cost_ms`` per record
and counting per key, a discarding sink, parallelism 2, a checkpoint every second, an embedded coordinator), then
the same job in PyFlink's thread mode (``benchmarks/pyflink_backpressure.py``, in PyFlink's own environment made by
``scripts/pyflink-env.sh``). Per run: the unaligned checkpoints' p50 and p90 after warm-up (the checkpoints up to
the first completed one left out, on both sides), what each persisted, and the records the last stage took per
second. Writes ``pyflink_side.md`` and ``pyflink_side.json`` into ``--out``.

Each side's figures are its own: Overtake's from its coordinator (trigger to the last ack recorded), PyFlink's from
its MiniCluster's REST API (``end_to_end_duration``, ``persisted_data``). PyFlink's time starts when its job is
submitted, before its tasks run, which lowers its rate a little.

PyFlink runs twice per depth: with its default checkpoint storage (the JobManager's heap: nothing is written) and
with its checkpoints written as files (``--storage files`` of ``benchmarks/pyflink_backpressure.py``; Flink does
not fsync them). Overtake's coordinator runs on PostgreSQL (a fresh database, as ``overtake bench``), and every
checkpoint of Overtake is durable: each subtask's state fsynced, the acks committed.

**The floor beside it, and where Overtake's p50 goes.** Right after Overtake's run at each depth, in the same run,
``benchmarks.ackpath`` measures on the same coordinator (``--floor-rounds`` rounds, through the host's ack relay) a
checkpoint of the same number of subtasks, each writing its share of the run's persisted p50, with no pipeline:
Overtake's own ack path alone; and beside each round what this machine allows for it: the round's bytes as one
fsynced file, one PostgreSQL commit and one request that does no database work. Overtake's checkpoints are split
part by part, each checkpoint at the subtask that acked last (medians over the checkpoints): trigger to its first
barrier, alignment, its snapshot (sync), its writes and ack (async), what is left of its own time, and its ack to
the checkpoint's completion.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.batches import ROOT, pyflink_python
from benchmarks.report import write_scenario


def _pct(xs: list[float], q: float) -> float | None:
    d = sorted(xs)
    return float(d[min(len(d) - 1, int(round(q * (len(d) - 1))))]) if d else None


def pyflink(depth: int, seconds: float, cost_ms: float, python: str, storage: str = "memory") -> dict[str, Any]:
    cmd = [python, "-I", str(ROOT / "benchmarks" / "pyflink_backpressure.py"), "--depth", str(depth),
           "--seconds", str(seconds), "--cost-ms", str(cost_ms), "--storage", storage]
    with tempfile.TemporaryDirectory(prefix="overtake-bench-pyflink-") as cwd:
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=seconds + 300)
    if out.returncode != 0 or not out.stdout.strip():
        last = (out.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise RuntimeError(f"the PyFlink job at depth {depth} failed: {last}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def row(side: str, depth: int, durations: list[float], persisted: list[float], throughput: float,
        completed: int) -> dict[str, Any]:
    return {"side": side, "depth": depth, "p50": _pct(durations, 0.5), "p90": _pct(durations, 0.9),
            "persisted_p50": _pct(persisted, 0.5),
            "persisted_mean": statistics.mean(persisted) if persisted else None,
            "throughput": throughput, "completed": completed}


PARTS = ("to the barrier", "alignment", "sync", "async", "rest of the subtask", "ack to completion")
"""Overtake's checkpoint, part by part at the subtask that acked last (``split``)."""


def split(checkpoint: Any) -> dict[str, float] | None:
    """One completed checkpoint's end-to-end time in ``PARTS``, taken at the subtask whose ack came last: its start
    delay, alignment, sync and async phases, the rest of its own time (trigger to its ack less those), and from its
    ack to the checkpoint's completion. None when it has no subtask figures."""
    if not checkpoint.subtasks or checkpoint.end_to_end_duration is None:
        return None
    last = max(checkpoint.subtasks, key=lambda st: st.end_to_end_duration)
    own = [last.start_delay, last.alignment_duration, last.sync_duration, last.async_duration]
    return dict(zip(PARTS, [*map(float, own), float(last.end_to_end_duration - sum(own)),
                            float(checkpoint.end_to_end_duration - last.end_to_end_duration)], strict=True))


def attribution(splits: list[dict[str, float]]) -> dict[str, float]:
    """The median of each part over the checkpoints (the medians need not add up to the p50 exactly)."""
    return {k: float(statistics.median(sp[k] for sp in splits)) for k in PARTS} if splits else {}


def job_subtasks(depth: int, parallelism: int) -> int:
    """Subtasks of the backpressured job: the source, ``depth`` keyed stages and the sink, each at ``parallelism``."""
    return (depth + 2) * parallelism


def overtake_splits(url: str, job_id: int) -> list[dict[str, float]]:
    """``split`` of each completed checkpoint of the job after warm-up (up to the first completed one)."""
    from client.sync import OvertakeClient

    with OvertakeClient(url) as client:
        done = sorted(c.id for c in client.list_checkpoints(job_id, limit=1000).items
                       if c.status.value == "COMPLETED")[1:]
        out = [split(client.get_checkpoint(job_id, cid)) for cid in done]
    return [sp for sp in out if sp is not None]


def floor_beside(url: str, db_url: str, subtasks: int, persisted_p50: float | None, rounds: int) -> dict[str, Any]:
    """The ack path alone and this machine's floor for a checkpoint of ``subtasks`` subtasks writing
    ``persisted_p50`` bytes between them (``benchmarks.ackpath``, through the host's relay)."""
    from benchmarks.ackpath import measure

    per = max(1, int((persisted_p50 or 0) // subtasks))
    st = measure(url, subtasks, rounds, per, db_url=db_url).as_dict()
    keep = ("relay_p50", "relay_write_span_p50", "relay_control_p50", "disk_floor_p50", "commit_floor_p50",
            "request_floor_p50", "floor_p50")
    return {"subtasks": subtasks, "bytes_per_subtask": per, **{k: st.get(k) for k in keep}}


def run(depths: list[int], seconds: float, status=lambda m: None, pg_admin_url: str | None = None,
        floor_rounds: int = 15, storages: tuple[str, ...] = ("memory", "files")) -> list[dict[str, Any]]:
    from app.local import LocalCoordinator
    from benchmarks.acks import new_pg_database
    from benchmarks.flip76 import Runner, Settings, spark_tasks_needed
    from benchmarks.timers import spark_session

    python = pyflink_python()
    if python is None:
        raise SystemExit("PyFlink's environment is missing: scripts/pyflink-env.sh makes it")
    s = Settings(depths=tuple(depths), backpressure_seconds=seconds)
    rows = []
    spark = spark_session(spark_tasks_needed(s))
    db_url, drop = new_pg_database(pg_admin_url or s.pg_admin_url)
    with tempfile.TemporaryDirectory(prefix="overtake-bench-pyflink-side-") as tmp:
        coordinator = LocalCoordinator(Path(tmp) / "coordinator", {"OVERTAKE_DATABASE_URL": db_url,
                                                                   "OVERTAKE_LOG_LEVEL": "WARNING"}).start()
        try:
            runner = Runner(spark, coordinator.url, s, status)
            for depth in depths:
                status(f"Overtake, unaligned, depth {depth}")
                o = runner.backpressured("unaligned", depth)
                r = row("Overtake", depth, [float(x) for x in o.durations_ms], [float(x) for x in o.persisted_bytes],
                        o.throughput, o.completed)
                r["parts"] = attribution(overtake_splits(coordinator.url, o.job_id))
                status(f"the ack path alone and the machine's floor, depth {depth}")
                r["floor"] = floor_beside(coordinator.url, db_url, job_subtasks(depth, s.parallelism),
                                          r["persisted_p50"], floor_rounds)
                rows.append(r)
                for storage in storages:
                    status(f"PyFlink, unaligned, depth {depth}, checkpoints in {storage}")
                    f = pyflink(depth, seconds, s.record_cost_ms, python, storage)
                    side = "PyFlink 2.3 (thread mode)" + ("" if storage == "memory" else ", checkpoints in files")
                    fr = row(side, depth, f["durations_ms"], f["persisted_bytes"], f["throughput"],
                             len(f["durations_ms"]))
                    fr.update(storage=storage, storage_seen=f.get("storage_seen"), files_left=f.get("files_left"))
                    rows.append(fr)
        finally:
            coordinator.stop()
            drop()
    return rows


def markdown(rows: list[dict[str, Any]], seconds: float, command: str = "") -> str:
    def ms(v: float | None) -> str:
        return "–" if v is None else f"{v:,.0f} ms" if v >= 10 else f"{v:.1f} ms"

    def kb(v: float | None) -> str:
        return "–" if v is None else f"{v / 1024:,.0f} KiB"

    lines = [
        "## Overtake beside PyFlink on the backpressured job\n",
        (f"`{command}`. " if command else "") + f"The FLIP-76 backpressured job (1 ms per record per keyed stage, "
        f"128 keys, 100-byte payloads, parallelism 2), unaligned checkpoints every second, {seconds:g} s per run, "
        "Overtake and PyFlink by turns at each depth. Checkpoints after warm-up (up to the first completed one). "
        "Overtake's checkpoints are durable (state fsynced, acks committed on PostgreSQL); PyFlink's are kept in the "
        "JobManager's heap by default, or written as files without an fsync.\n",
        "| depth | side | completed | p50 | p90 | persisted p50 | mean | records/s (last stage) |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(f"| {r['depth']} | {r['side']} | {r['completed']} | {ms(r['p50'])} | {ms(r['p90'])} "
                     f"| {kb(r['persisted_p50'])} | {kb(r['persisted_mean'])} | {r['throughput']:,.0f} |")
    ours = [r for r in rows if r["side"] == "Overtake"]
    if any(r.get("parts") for r in ours):
        lines += ["", "**Overtake's checkpoints part by part** (at the subtask that acked last; medians over the "
                  "checkpoints, which need not add up to the p50):", "",
                  "| depth | p50 | " + " | ".join(PARTS) + " |", "| ---: | ---: |" + " ---: |" * len(PARTS)]
        for r in ours:
            parts = r.get("parts") or {}
            lines.append(f"| {r['depth']} | {ms(r['p50'])} | " + " | ".join(ms(parts.get(k)) for k in PARTS) + " |")
    if any(r.get("floor") for r in ours):
        lines += ["", "**The floor beside it** (measured right after Overtake's run at each depth, on the same "
                  "coordinator: the same number of subtasks each writing its share of the p50's bytes, no pipeline):",
                  "", "| depth | subtasks × bytes | Overtake's ack path alone | its writes | its control path | "
                  "machine floor | of it: disk | commit | request |",
                  "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in ours:
            f = r.get("floor") or {}
            if not f:
                continue
            lines.append(f"| {r['depth']} | {f['subtasks']} × {kb(f['bytes_per_subtask'])} | {ms(f['relay_p50'])} | "
                         f"{ms(f['relay_write_span_p50'])} | {ms(f['relay_control_p50'])} | {ms(f['floor_p50'])} | "
                         f"{ms(f['disk_floor_p50'])} | {ms(f['commit_floor_p50'])} | {ms(f['request_floor_p50'])} |")
    lines.append("")
    by = {(r["side"], r["depth"]): r for r in rows}
    for depth in sorted({r["depth"] for r in rows}):
        o = by.get(("Overtake", depth))
        for side in [k[0] for k in by if k[1] == depth and k[0] != "Overtake"]:
            f = by[(side, depth)]
            if o and o["p50"] and f["p50"] and f["throughput"]:
                lines.append(f"Depth {depth}, against {side}: Overtake's p50 {o['p50'] / f['p50']:.2f}×, its "
                             f"records/s {o['throughput'] / f['throughput']:.2f}×.")
        fl = (o or {}).get("floor") or {}
        if o and o["p50"] and fl.get("floor_p50"):
            lines.append(f"Depth {depth}: Overtake's p50 is {o['p50'] / fl['floor_p50']:.2f}× the machine's floor "
                         f"for its bytes ({ms(fl['floor_p50'])}) and {o['p50'] / fl['relay_p50']:.2f}× its ack path "
                         f"alone ({ms(fl['relay_p50'])}).")
    d = sorted({r["depth"] for r in ours})
    if len(d) >= 2:
        lo, hi = by[("Overtake", d[0])], by[("Overtake", d[-1])]
        if lo["p50"] and hi["p50"]:
            lines.append(f"Overtake's p50 at depth {d[-1]} against depth {d[0]}: {hi['p50'] / lo['p50']:.2f}×.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.pyflink_side", description=__doc__.split("\n\n")[0])
    p.add_argument("--depths", type=int, nargs="+", default=[1, 3])
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--out", default="bench-results")
    p.add_argument("--pg", default=None, help="PostgreSQL admin URL for the coordinator's fresh database "
                                              "(default: overtake bench's)")
    p.add_argument("--floor-rounds", type=int, default=15, help="rounds of the ack path alone at each depth")
    p.add_argument("--storages", nargs="+", choices=("memory", "files"), default=["memory", "files"],
                   help="PyFlink's checkpoint storages to run")
    a = p.parse_args(argv)
    rows = run(a.depths, a.seconds, lambda m: print(m, file=sys.stderr), a.pg, a.floor_rounds, tuple(a.storages))
    command = "python -m benchmarks.pyflink_side " + " ".join(argv if argv is not None else sys.argv[1:])
    text = markdown(rows, a.seconds, command.strip())
    write_scenario(Path(a.out), "pyflink_side", text, {"rows": rows, "seconds": a.seconds, "depths": a.depths})
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
