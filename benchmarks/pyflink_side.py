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


def pyflink(depth: int, seconds: float, cost_ms: float, python: str) -> dict[str, Any]:
    cmd = [python, "-I", str(ROOT / "benchmarks" / "pyflink_backpressure.py"), "--depth", str(depth),
           "--seconds", str(seconds), "--cost-ms", str(cost_ms)]
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


def run(depths: list[int], seconds: float, status=lambda m: None) -> list[dict[str, Any]]:
    from app.local import LocalCoordinator
    from benchmarks.flip76 import Runner, Settings, spark_tasks_needed
    from benchmarks.timers import spark_session

    python = pyflink_python()
    if python is None:
        raise SystemExit("PyFlink's environment is missing: scripts/pyflink-env.sh makes it")
    s = Settings(depths=tuple(depths), backpressure_seconds=seconds)
    rows = []
    spark = spark_session(spark_tasks_needed(s))
    with tempfile.TemporaryDirectory(prefix="overtake-bench-pyflink-side-") as tmp:
        coordinator = LocalCoordinator(Path(tmp) / "coordinator", {"OVERTAKE_LOG_LEVEL": "WARNING"}).start()
        try:
            runner = Runner(spark, coordinator.url, s, status)
            for depth in depths:
                status(f"Overtake, unaligned, depth {depth}")
                o = runner.backpressured("unaligned", depth)
                rows.append(row("Overtake", depth, [float(x) for x in o.durations_ms],
                                [float(x) for x in o.persisted_bytes], o.throughput, o.completed))
                status(f"PyFlink, unaligned, depth {depth}")
                f = pyflink(depth, seconds, s.record_cost_ms, python)
                rows.append(row("PyFlink 2.3 (thread mode)", depth, f["durations_ms"], f["persisted_bytes"],
                                f["throughput"], len(f["durations_ms"])))
        finally:
            coordinator.stop()
    return rows


def markdown(rows: list[dict[str, Any]], seconds: float, command: str = "") -> str:
    def ms(v: float | None) -> str:
        return "–" if v is None else f"{v:,.0f} ms"

    def kb(v: float | None) -> str:
        return "–" if v is None else f"{v / 1024:,.0f} KiB"

    lines = [
        "## Overtake beside PyFlink on the backpressured job\n",
        (f"`{command}`. " if command else "") + f"The FLIP-76 backpressured job (1 ms per record per keyed stage, "
        f"128 keys, 100-byte payloads, parallelism 2), unaligned checkpoints every second, {seconds:g} s per run, "
        "Overtake and PyFlink by turns at each depth. Checkpoints after warm-up (up to the first completed one).\n",
        "| depth | side | completed | p50 | p90 | persisted p50 | mean | records/s (last stage) |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(f"| {r['depth']} | {r['side']} | {r['completed']} | {ms(r['p50'])} | {ms(r['p90'])} "
                     f"| {kb(r['persisted_p50'])} | {kb(r['persisted_mean'])} | {r['throughput']:,.0f} |")
    by = {(r["side"].split()[0], r["depth"]): r for r in rows}
    for depth in sorted({r["depth"] for r in rows}):
        o, f = by.get(("Overtake", depth)), by.get(("PyFlink", depth))
        if o and f and o["p50"] and f["p50"]:
            lines.append(f"\nDepth {depth}: Overtake's p50 {o['p50'] / f['p50']:.2f}× PyFlink's, its records/s "
                         f"{o['throughput'] / f['throughput']:.2f}× PyFlink's.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.pyflink_side", description=__doc__.split("\n\n")[0])
    p.add_argument("--depths", type=int, nargs="+", default=[1, 3])
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--out", default="bench-results")
    a = p.parse_args(argv)
    rows = run(a.depths, a.seconds, lambda m: print(m, file=sys.stderr))
    command = "python -m benchmarks.pyflink_side " + " ".join(argv if argv is not None else sys.argv[1:])
    text = markdown(rows, a.seconds, command.strip())
    write_scenario(Path(a.out), "pyflink_side", text, {"rows": rows, "seconds": a.seconds, "depths": a.depths})
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
