"""The benchmark report: machine facts, settings, targets, one table per scenario (``report.md``, ``results.json``),
and a scenario's own report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.flip76 import RunStats
from benchmarks.plots import plots
from benchmarks.results import BenchResults, ms, nbytes, ratio
from benchmarks.targets import targets


def _table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or ("l" + "r" * (len(header) - 1))
    sep = ["---" if a == "l" else "---:" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def checkpoint_table(r: BenchResults) -> str:
    rows = []
    for d in r.settings.depths:
        al = r.run_of("aligned", d)
        a_p50 = al.p50_or_bound if al else (None, False)
        for pol in r.settings.policies:
            x = r.run_of(pol, d)
            if x is None:
                continue
            p50, bound = x.p50_or_bound
            if pol == "aligned" or bound:
                vs = "–"
            else:
                vs = ratio(a_p50[0], p50, a_p50[1])
            rows.append([
                str(d), pol, ms(p50, bound), ms(x.p90), ms(x.max), vs, nbytes(x.persisted_avg),
                nbytes(max(x.persisted_bytes) if x.persisted_bytes else None),
                f"{x.completed} / {x.aborted}", str(x.unfinished), f"{x.throughput:,.0f}",
            ])
    return _table(["depth", "policy", "p50", "p90", "max", "aligned p50 ÷ p50", "persisted in-flight (avg)",
                   "(max)", "completed / aborted", "unfinished at end", "records/s"], rows, "ll" + "r" * 9)


def _vertex_order(v: str) -> tuple[int, str]:
    return (0 if v == "source" else 1, v)


def markdown(r: BenchResults) -> str:
    s = r.settings
    out: list[str] = []
    out.append("# Overtake benchmarks: the FLIP-76 test plan\n")
    out.append(f"Run {r.started}, {r.seconds / 60:.1f} min, {'quick' if s.quick else 'full'} settings. "
               f"Command: `{r.command}`. Every comparison below is measured within this run.\n")
    out.append("## Machine\n")
    out.append(_table(["", ""], [[k, v] for k, v in r.machine.items()], "ll") + "\n")
    out.append("## Settings\n")
    net = s.network()
    rows = [
        ["parallelism", str(s.parallelism)],
        ["slow stage", f"{s.record_cost_ms} ms per record (sleep), keyed count"],
        ["source", f"SequenceSource, unbounded, as fast as its output takes records; {s.keys} keys, Zipf skew "
                   f"{s.skew}, {s.payload_bytes} B payload per record"],
        ["checkpoint interval", f"{s.interval_ms} ms, max 1 concurrent"],
        ["alignment timeout (aligned_then_unaligned)", f"{s.alignment_timeout_ms} ms"],
        ["network (runtime defaults = Flink's)", f"{net.buffer_size // 1024} KiB buffers, "
         f"{net.exclusive_buffers_per_channel} exclusive/channel + {net.floating_buffers_per_gate} floating/gate, "
         f"≤ {net.max_buffers_per_output_channel} buffers/output channel, flush {net.flush_interval * 1000:.0f} ms"],
        ["run length, scenarios 1-2", f"{s.backpressure_seconds:g} s each (from the moment all tasks are up)"],
        ["run length, scenario 3", f"{s.no_backpressure_seconds:g} s each, {s.no_backpressure_repeats} "
                                   "alternating runs per variant"],
        ["disk", f"{s.disk_total_mib} MiB per measurement, {s.disk_repeats} alternating repeats"],
        ["ack bench", f"{s.ack_subtasks} subtasks × {s.ack_checkpoints} checkpoints"],
        ["coordinator", "PostgreSQL, a fresh database per run; blobs in a local directory"],
    ]
    out.append(_table(["setting", "value"], rows, "ll") + "\n")
    out.append("## Targets\n")
    tg = targets(r)
    out.append("| target | measured | status | by how much |\n| --- | --- | --- | --- |")
    out.append("\n".join(t.row() for t in tg) + "\n")
    if r.errors:
        out.append("## Errors\n")
        out.append("\n".join(f"- **{k}**: {v}" for k, v in r.errors.items()) + "\n")

    if r.backpressure:
        out.append("## 1. Checkpoint duration under sustained backpressure\n")
        out.append("fast source → (key_by → slow stage) × depth → sink. End-to-end duration of the checkpoints "
                   "completed after warm-up (the checkpoints up to the first completed one, which waited for "
                   "Spark to start the tasks, are left out). `> x` means no checkpoint completed after warm-up: "
                   "x is the age of the oldest one still pending when the run ended. *Unfinished at end* are "
                   "checkpoints pending when the run ended; they are not counted as aborted.\n")
        out.append(checkpoint_table(r) + "\n")
        if "checkpoint_duration.png" in r.plots:
            out.append("![checkpoint duration](checkpoint_duration.png)\n")
        rows = []
        for x in r.backpressure:
            if x.policy == "aligned" or not x.breakdown:
                continue
            for v in sorted(x.breakdown, key=_vertex_order):
                b = x.breakdown[v]
                rows.append([str(x.depth), x.policy or "", v, ms(b.get("start_delay")), ms(b.get("alignment")),
                             ms(b.get("sync")), ms(b.get("async")), ms(b.get("ack"))])
        if rows:
            out.append("Where an unaligned checkpoint's time goes, from the subtasks' own ack metrics (medians "
                       "over the completed checkpoints after warm-up, per vertex): *first barrier* = trigger → first "
                       "barrier at the subtask, *last barrier* = first → last input barrier (in-flight input "
                       "still being persisted), *sync* = snapshot, *async* = the subtask's own work before the one "
                       "request that carries its blobs and ack, *acked* = trigger → ack recorded by the coordinator "
                       "(so acked − first barrier − sync − async is that request).\n")
            out.append(_table(["depth", "policy", "vertex", "first barrier", "last barrier", "sync", "async",
                               "acked"], rows, "lll" + "r" * 5) + "\n")
        if r.ack_path:
            out.append("**Floor of the ack path** (`benchmarks/ackpath.py`, no pipeline): for each depth, as many "
                       "threads as that pipeline has subtasks do, at once, what every subtask does after its "
                       "barrier with a channel-state blob of the unaligned run's mean persisted bytes per subtask, "
                       "against the same coordinator, in alternating rounds: *direct* — write the state as one "
                       "object into the blob store (fsynced) and ack its handle, the coordinator stats it; *through "
                       "the coordinator* — blobs and ack in one request. *All acked* is the shortest checkpoint "
                       "those subtasks can have on this machine, whatever the barriers do.\n")
            rows = []
            for a in r.ack_path:
                d = a.as_dict()
                depth = a.subtasks // s.parallelism - 1
                un = r.run_of("unaligned", depth)
                rows.append([str(depth), str(a.subtasks), nbytes(a.channel_blob_bytes), ms(d["direct_p50"]),
                             ms(d["write_p50"]), ms(d["ack_p50"]), ms(a.p50), ratio(a.p50, d["direct_p50"]),
                             ms(un.p50) if un else "–"])
            out.append(_table(["depth", "subtasks", "channel blob", "all acked p50, direct", "write p50",
                               "ack p50", "all acked p50, through the coordinator", "through ÷ direct",
                               "unaligned checkpoint p50"], rows) + "\n")
        reasons = sorted({f"{x.label}: {a}" for x in r.backpressure for a in x.abort_reasons})
        if reasons:
            out.append("Abort reasons: " + "; ".join(reasons) + "\n")

    bp = [x for x in r.backpressure if x.depth == min(s.depths)]
    if bp and r.no_checkpoints_backpressure:
        base = r.no_checkpoints_backpressure
        out.append(f"## 2. Throughput under backpressure (depth {base.depth})\n")
        out.append("Records per second entering the last slow stage (both subtasks together).\n")
        rows = [["no checkpoints", f"{base.throughput:,.0f}", "1.00×"]]
        rows += [[x.policy or "", f"{x.throughput:,.0f}", ratio(x.throughput, base.throughput)] for x in bp]
        out.append(_table(["policy", "records/s", "vs no checkpoints"], rows) + "\n")

    if r.free:
        import statistics

        out.append("## 3. Throughput without backpressure\n")
        out.append("fast source → key_by → keyed count (no sleep) → sink: no slow stage, the pipeline runs as "
                   "fast as the CPUs allow (the keyed count is the busiest stage, so some buffers are still in "
                   "flight: see the persisted bytes). Runs alternate between the two variants; the medians are "
                   "compared. Coordinator CPU is the coordinator process's CPU time over the run's wall time.\n")
        rows = []
        groups: dict[str, list[RunStats]] = {}
        for x in r.free:
            groups.setdefault(x.policy or "no checkpoints", []).append(x)
        base = statistics.median(x.throughput for x in groups.get("no checkpoints", [])) if "no checkpoints" in \
            groups else None
        for name, xs in groups.items():
            med = statistics.median(x.throughput for x in xs)
            each = ", ".join(f"{x.throughput:,.0f}" for x in xs)
            extra = ""
            if name != "no checkpoints":
                pers = [b for x in xs for b in x.persisted_bytes]
                extra = (f"{sum(x.completed for x in xs)} completed, persisted in-flight "
                         f"{nbytes(sum(pers) / len(pers) if pers else None)} avg")
            cpu = [x.coordinator_cpu_s / x.wall_seconds for x in xs if x.coordinator_cpu_s is not None]
            rows.append([name if name == "no checkpoints" else f"{name} every {s.interval_ms} ms",
                         f"{med:,.0f}", each, ratio(med, base), extra,
                         f"{statistics.mean(cpu) * 100:.0f}%" if cpu else "–"])
        out.append(_table(["variant", "records/s (median)", "each run", "vs no checkpoints", "checkpoints",
                           "coordinator CPU (of one core)"], rows) + "\n")
        if "throughput.png" in r.plots:
            out.append("![throughput](throughput.png)\n")

    if r.disk:
        d = r.disk
        out.append("## 4. Channel-state write bandwidth\n")
        out.append(f"Same directory (`{Path(d.directory).name}` in the results folder), measurements alternated. "
                   f"Raw: one file written sequentially in 4 MiB writes, then fsync; the best of "
                   f"{len(d.raw_mib_s)} ({', '.join(f'{x:,.0f}' for x in d.raw_mib_s)} MiB/s). Channel state (the mean "
                   f"of as many, alternated with them): {d.writers} subtasks at once, each a process of its own, each the runtime's "
                   f"`ChannelStateWriter` fed real {d.buffer_bytes:,} B buffers of the benchmark's records over 2 "
                   f"input and 2 output channels, one blob of {nbytes(d.blob_bytes)} (a subtask's in-flight "
                   f"capacity with the default sizing) per checkpoint, each written to its own file under its "
                   f"checkpoint's prefix and fsynced with its directory, as a subtask writes its state straight "
                   f"into a `file://` store.\n")
        rows = [
            ["raw sequential write + fsync", f"{d.raw:,.0f}", "100%"],
            ["channel state: writer → file per blob + fsync", f"{d.channel_state:,.0f}", f"{d.ratio * 100:.0f}%"],
            ["channel state: writer only (no disk)", f"{d.writer_only:,.0f}",
             f"{d.writer_only / d.raw * 100:.0f}%" if d.raw else "–"],
        ]
        out.append(_table(["measurement", "MiB/s", "vs raw"], rows) + "\n")
        if d.fsync_per_blob_ms:
            out.append(f"Mean durable write per blob (write, fsync, directory fsync): "
                       f"{sum(d.fsync_per_blob_ms) / len(d.fsync_per_blob_ms):.2f} ms.\n")

    if r.acks is not None:
        a = r.acks
        out.append("## 5. Coordinator ack throughput\n")
        out.append(f"`benchmarks.acks`: a {a.subtasks:,}-subtask job on PostgreSQL (a fresh database), real HTTP "
                   f"through uvicorn, {a.checkpoints} checkpoints, a load generator of {a.processes} processes × "
                   f"{a.concurrency} keep-alive connections; each ack is answered only after its commit.\n")
        out.append(a.markdown() + "\n")
        if a.errors:
            out.append(f"Non-200 responses: {a.errors}\n")

    if r.inflight is not None and r.inflight.runs:
        from benchmarks import inflight

        out.append(inflight.markdown(r.inflight))
    return "\n".join(out)


def readme_section(r: BenchResults, plot_path: str = "checkpoint_duration.png") -> str:
    """A compact Results section for the README: the machine, the command, the targets and the main tables."""
    import statistics

    s = r.settings
    m = r.machine
    out = ["## Results\n"]
    out.append(f"Measured on {m.get('cores', '?')} cores ({m.get('CPU', '?')}), {m.get('memory', '?')}, "
               f"Python {m.get('Python', '?')}, PySpark {m.get('PySpark', '?')}, Java {m.get('Java', '?')}, "
               f"PostgreSQL {m.get('PostgreSQL', '?')}; load average {m.get('load average at start', '?')} at the "
               f"start. Command: `{r.command}` ({r.seconds / 60:.0f} min, {r.started}). Every comparison is "
               f"within this one run" + (
                   # the pipeline settings of the scenarios that run the bench's own job; a scenario with a job of
                   # its own (kafka, batches, ...) states its settings in its section
                   f"; parallelism {s.parallelism}, a slow stage of {s.record_cost_ms:g} ms per record, checkpoints "
                   f"every {s.interval_ms} ms, the runtime's default (Flink's) network sizing"
                   if r.backpressure or r.free or r.no_checkpoints_backpressure is not None else "") + ".\n")
    out.append("| target | measured | status | by how much |\n| --- | --- | --- | --- |")
    out.append("\n".join(t.row() for t in targets(r)) + "\n")
    if r.backpressure:
        out.append(f"**Checkpoint duration under sustained backpressure** ({s.backpressure_seconds:g} s per run, "
                   "warm-up left out; `> x`: none completed, x is the age of the one still pending at the end):\n")
        out.append(checkpoint_table(r) + "\n")
        out.append(f"![checkpoint duration by policy and shuffle depth]({plot_path})\n")
        if r.ack_path:
            floors = ", ".join(f"{ms(a.direct_p50)} for {a.subtasks} subtasks (depth {a.subtasks // s.parallelism - 1})"
                               for a in r.ack_path)
            out.append(f"Floor of the ack path alone (every subtask writes its state into the store and acks its "
                       f"handle, no pipeline): {floors}.\n")
    rows = []
    base = r.no_checkpoints_backpressure
    if base:
        for x in [x for x in r.backpressure if x.depth == min(s.depths)]:
            rows.append([f"under backpressure, {x.policy}", f"{x.throughput:,.0f}", f"{base.throughput:,.0f}",
                         ratio(x.throughput, base.throughput)])
    if r.free:
        a = [x.throughput for x in r.free if x.policy is None]
        b = [x.throughput for x in r.free if x.policy == "unaligned"]
        if a and b:
            rows.append([f"no backpressure, unaligned every {s.interval_ms} ms (median of {len(b)})",
                         f"{statistics.median(b):,.0f}", f"{statistics.median(a):,.0f}",
                         ratio(statistics.median(b), statistics.median(a))])
    if rows:
        out.append("**Throughput** (records/s into the last stage):\n")
        out.append(_table(["run", "records/s", "no checkpoints", "ratio"], rows) + "\n")
    if r.disk:
        d = r.disk
        out.append(f"**Channel-state writes**: {d.channel_state:,.0f} MiB/s (writer → {nbytes(d.blob_bytes)} "
                   f"blob files, fsynced each) vs {d.raw:,.0f} MiB/s raw sequential write + fsync on the same "
                   f"disk: {d.ratio * 100:.0f}%.\n")
    if r.acks is not None:
        a = r.acks
        out.append(f"**Coordinator acks** ({a.subtasks:,} subtasks, PostgreSQL): {a.acks_per_s:,.0f} durable "
                   f"acks/s, {a.ratio * 100:.0f}% of the {a.ceiling_rps:,.0f} req/s no-database ceiling; batch "
                   f"route {a.batch_acks_per_s:,.0f} acks/s.\n")
    return "\n".join(out)


def write(r: BenchResults, out: Path) -> Path:
    """Plots, ``report.md`` and ``results.json`` into ``out``; returns the report's path."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    try:
        r.plots = plots(r, out)
    except Exception as e:  # noqa: BLE001 - a report without plots is still a report
        r.errors["plots"] = f"{type(e).__name__}: {e}"
    path = out / "report.md"
    path.write_text(markdown(r))
    (out / "readme-results.md").write_text(readme_section(r))
    data = {
        "settings": r.settings.as_dict(), "machine": r.machine, "command": r.command, "started": r.started,
        "seconds": r.seconds, "backpressure": [x.as_dict() for x in r.backpressure],
        "no_checkpoints_backpressure": r.no_checkpoints_backpressure.as_dict()
        if r.no_checkpoints_backpressure else None,
        "no_backpressure": [x.as_dict() for x in r.free],
        "disk": r.disk.as_dict() if r.disk else None,
        "acks": _acks_dict(r.acks), "ack_path": [a.as_dict() for a in r.ack_path],
        "inflight": [x.as_dict() for x in r.inflight.runs] if r.inflight is not None else None,
        "errors": r.errors,
        "targets": [t.__dict__ for t in targets(r)],
    }
    (out / "results.json").write_text(json.dumps(data, indent=2, default=str))
    return path


def _acks_dict(a: Any) -> dict | None:
    if a is None:
        return None
    from dataclasses import asdict

    return {**asdict(a), "ratio": a.ratio, "completion_p50_ms": a.completion_p50()}


def write_scenario(out: Path, name: str, text: str, data: dict[str, Any]) -> str:
    """A scenario's own report: ``name``.md with ``text`` and ``name``.json with ``data``, in ``out``; returns text."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(text)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2, default=str))
    return text
