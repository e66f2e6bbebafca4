"""State straight into the blob store against state through the coordinator, in one run (``overtake bench state``).

Two coordinators on PostgreSQL, identical but for ``OVERTAKE_STATE_WRITES``: ``direct`` (subtasks write their state
into the blob store and ack its handle; the default) and ``coordinator`` (every byte through the coordinator's
process). On one Spark session, alternating between the two:

1. unaligned checkpoints under backpressure at shuffle depths 1, 2, 3 (the FLIP-76 pipeline of scenario 1);
2. the coordinator's CPU per checkpoint as in-flight bytes grow (network buffers small, default, large, depth 1);
3. one large-state run: big network buffers hold ≥ 50 MiB in flight per subtask, a checkpoint every second; when
   this disk cannot write that much within a second, once more at an interval sized to the disk (twice the time
   its measured raw bandwidth needs for the bytes the direct path persisted per checkpoint);
4. the control path, without a pipeline: trigger delivery to 8 subscribers, the ack path of 8 subtasks with 1 MiB
   of state each (the direct coordinator; the through-coordinator path for comparison).

Writes ``state.md`` and ``state.json`` into ``--out``.
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.disk import raw_write
from benchmarks.flip76 import Runner, RunStats, Settings
from spark_plugin.network.config import NetworkConfig

PATHS = ("direct", "coordinator")
PATH_LABEL = {"direct": "direct", "coordinator": "through the coordinator"}


def buffer_sizes() -> dict[str, NetworkConfig]:
    """The in-flight sizes of the CPU comparison: Flink's buffer numbers with small, default and large buffers."""
    return {
        "small (8 KiB buffers)": NetworkConfig(buffer_size=8 * 1024),
        "default (32 KiB buffers)": NetworkConfig(),
        "large (128 KiB buffers)": NetworkConfig(buffer_size=128 * 1024),
    }


def large_state_network() -> NetworkConfig:
    """≥ 50 MiB in flight per keyed subtask: 2 MiB buffers, 48 exclusive per channel, 32 floating per gate, 16 per
    output channel. Output channels hold only their credit plus one buffer, so the input side is what counts: a keyed
    subtask's two input channels hold up to 192 MiB, of which about 145 MiB were in flight at each checkpoint in a
    run at 2026-11-26 00:10 UTC (291 MiB persisted per checkpoint in all; direct 556 ms p50, through the
    coordinator 2,481 ms). With 24 exclusive buffers (about 56 MiB per keyed subtask) the through-coordinator path
    still kept up with a 1 s interval (584 ms p50, direct 248 ms), once acks went through the host's relay."""
    return NetworkConfig(buffer_size=2 << 20, exclusive_buffers_per_channel=48, floating_buffers_per_gate=32,
                         max_buffers_per_output_channel=16)


def disk_sized_interval_ms(persisted_bytes: float, raw_mib_s: float, floor_ms: int, step_ms: int = 500) -> int:
    """The checkpoint interval for state of ``persisted_bytes`` per checkpoint on a disk that writes ``raw_mib_s``:
    twice the time of one raw sequential write of those bytes, rounded up to ``step_ms``, never below ``floor_ms``.
    A user with this much in flight sets the interval the same way: a checkpoint's writes take at most half of it."""
    if persisted_bytes <= 0 or raw_mib_s <= 0:
        return floor_ms
    need_ms = 2 * persisted_bytes / (raw_mib_s * (1 << 20)) * 1000
    return max(floor_ms, math.ceil(need_ms / step_ms) * step_ms)


def raw_mib_s(directory: Path, total: int = 256 << 20, rounds: int = 3) -> float:
    """The median raw sequential write bandwidth (fsynced) of the disk under ``directory``."""
    return statistics.median(total / (1 << 20) / raw_write(directory / "raw-write-probe", total) for _ in range(rounds))


@dataclass
class PathRun:
    path: str
    what: str
    stats: RunStats

    @property
    def checkpoints(self) -> int:
        return self.stats.warm_up + self.stats.checkpoints

    @property
    def cpu_per_checkpoint_ms(self) -> float | None:
        if self.stats.coordinator_cpu_s is None or not self.checkpoints:
            return None
        return self.stats.coordinator_cpu_s * 1000 / self.checkpoints

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "what": self.what, "stats": self.stats.as_dict(),
                "cpu_per_checkpoint_ms": self.cpu_per_checkpoint_ms}


@dataclass
class StatePathsResult:
    settings: dict[str, Any]
    depth_runs: list[PathRun] = field(default_factory=list)
    cpu_runs: list[PathRun] = field(default_factory=list)
    large_runs: list[PathRun] = field(default_factory=list)
    trigger: Any = None
    ack_path: Any = None

    def run(self, runs: list[PathRun], path: str, what: str) -> PathRun | None:
        return next((r for r in runs if r.path == path and r.what == what), None)


def _p(v: float | None, unit: str = " ms", digits: int = 0) -> str:
    return "–" if v is None else f"{v:,.{digits}f}{unit}"


def _mib(v: float | None) -> str:
    return "–" if v is None else f"{v / (1 << 20):,.2f} MiB"


def measure(spark: Any, pg_admin_url: str, s: Settings, status: Callable[[str], None],
            large_seconds: float = 20.0, cpu_seconds: float = 20.0) -> StatePathsResult:
    from app.local import LocalCoordinator
    from benchmarks.ackpath import measure as ack_path
    from benchmarks.acks import new_pg_database
    from benchmarks.control import trigger_delivery

    result = StatePathsResult(settings={**s.as_dict(), "large_seconds": large_seconds, "cpu_seconds": cpu_seconds,
                                        "large_network": asdict(large_state_network())})
    drops = []
    coordinators: dict[str, Any] = {}
    databases: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="overtake-bench-state-") as tmp:
        try:
            for path in PATHS:
                db, drop = new_pg_database(pg_admin_url)
                drops.append(drop)
                databases[path] = db
                coordinators[path] = LocalCoordinator(
                    Path(tmp) / path,
                    {"OVERTAKE_DATABASE_URL": db, "OVERTAKE_LOG_LEVEL": "WARNING", "OVERTAKE_STATE_WRITES": path},
                ).start()
            runners = {p: Runner(spark, c.url, s, status, c.proc.pid) for p, c in coordinators.items()}

            for d in s.depths:
                for path in PATHS:
                    status(f"unaligned, depth {d}, {PATH_LABEL[path]}")
                    st = runners[path].backpressured("unaligned", d, scenario=f"state-{path}")
                    result.depth_runs.append(PathRun(path, f"depth {d}", st))

            for what, net in buffer_sizes().items():
                for path in PATHS:
                    status(f"coordinator CPU, {what}, {PATH_LABEL[path]}")
                    st = runners[path].backpressured("unaligned", 1, scenario=f"cpu-{path}", network=net,
                                                     seconds=cpu_seconds)
                    result.cpu_runs.append(PathRun(path, what, st))

            for path in PATHS:
                status(f"large state (≥ 50 MiB in flight per subtask), {PATH_LABEL[path]}")
                st = runners[path].backpressured("unaligned", 1, scenario=f"large-{path}",
                                                 network=large_state_network(), seconds=large_seconds,
                                                 payload_bytes=8 * 1024)
                result.large_runs.append(PathRun(path, "large", st))

            direct = result.run(result.large_runs, "direct", "large")
            raw = raw_mib_s(Path(tmp))
            sized = disk_sized_interval_ms(direct.stats.persisted_avg or 0, raw, s.interval_ms)
            result.settings.update(large_raw_mib_s=raw, large_sized_interval_ms=sized)
            if sized > s.interval_ms:
                for path in PATHS:
                    status(f"large state, a checkpoint every {sized} ms (sized to this disk), {PATH_LABEL[path]}")
                    st = runners[path].backpressured("unaligned", 1, scenario=f"large-sized-{path}",
                                                     network=large_state_network(), seconds=large_seconds,
                                                     payload_bytes=8 * 1024, checkpoint={"interval": sized})
                    result.large_runs.append(PathRun(path, "large, sized interval", st))

            status("control path: trigger delivery to 8 subscribers")
            result.trigger = trigger_delivery(coordinators["direct"].url, subscribers=8, rounds=30)
            status("control path: 8 subtasks x 1 MiB of state")
            result.ack_path = ack_path(coordinators["direct"].url, 8, 20, 1 << 20, db_url=databases["direct"])
        finally:
            for c in coordinators.values():
                c.stop()
            for drop in drops:
                try:
                    drop()
                except Exception:  # noqa: BLE001 - a database left behind is named by its prefix
                    pass
    return result


@dataclass
class Target:
    name: str
    measured: str
    met: bool | None
    detail: str

    def row(self) -> str:
        mark = {True: "✅ met", False: "❌ missed", None: "❔ not determined"}[self.met]
        return f"| {self.name} | {self.measured} | {mark} | {self.detail} |"


def targets(r: StatePathsResult) -> list[Target]:
    out: list[Target] = []
    d1, d3 = r.run(r.depth_runs, "direct", "depth 1"), r.run(r.depth_runs, "direct", "depth 3")
    if d1 is not None:
        p = d1.stats.p50
        out.append(Target("direct, depth 1: unaligned p50 ≤ 20 ms", _p(p), None if p is None else p <= 20,
                          "–" if p is None else f"{p / 20:.2f}× the target"))
    if d1 is not None and d3 is not None and d1.stats.p50 and d3.stats.p50:
        rr = d3.stats.p50 / d1.stats.p50
        out.append(Target("direct: depth 3 p50 ≤ 1.3 × depth 1", f"{_p(d3.stats.p50)} / {_p(d1.stats.p50)} = {rr:.2f}×",
                          rr <= 1.3, f"{rr / 1.3:.2f}× the bound"))
    if r.trigger is not None:
        t = r.trigger.as_dict()
        p = t["p50_after_response"]
        out.append(Target("trigger delivery to every subtask (8) ≤ 2 ms p50", f"{_p(p, digits=2)} after the trigger "
                          f"committed ({_p(t['p50_to_last'], digits=1)} from the trigger request)",
                          None if p is None else p <= 2, "–" if p is None else f"{p / 2:.2f}× the target"))
    if r.ack_path is not None:
        a = r.ack_path.as_dict()
        p = r.ack_path.relay_p50
        out.append(Target("ack path, 8 subtasks × 1 MiB ≤ 15 ms p50", f"{_p(p, digits=1)} through the host's relay: "
                          f"all 8 objects durable {_p(a['relay_write_span_p50'], digits=1)} after the start (the same "
                          f"8 MiB as one file with one fsync: {_p(a['disk_floor_p50'], digits=1)}), then all acked "
                          f"{_p(a['relay_control_p50'], digits=1)} later (an ack request per subtask "
                          f"{_p(r.ack_path.direct_p50, digits=1)}, through the coordinator {_p(r.ack_path.p50, digits=1)})"
                          f"{_floor(a)}",
                          None if p is None else p <= 15, "–" if p is None else f"{p / 15:.2f}× the target"))
    small = [x for x in r.cpu_runs if x.path == "direct"]
    if len(small) >= 2 and all(x.cpu_per_checkpoint_ms for x in small):
        lo, hi = small[0], small[-1]
        grow_bytes = (hi.stats.persisted_avg or 0) / max(lo.stats.persisted_avg or 1, 1)
        grow_cpu = hi.cpu_per_checkpoint_ms / lo.cpu_per_checkpoint_ms
        out.append(Target("direct: coordinator CPU per checkpoint flat as in-flight bytes grow",
                          f"in-flight ×{grow_bytes:.1f}, CPU per checkpoint ×{grow_cpu:.2f}",
                          grow_cpu <= 1.5, f"({_p(lo.cpu_per_checkpoint_ms, digits=1)} → "
                          f"{_p(hi.cpu_per_checkpoint_ms, digits=1)})"))
    sized = int(r.settings.get("large_sized_interval_ms") or 0)
    at_1s = _large_target(r, "large", int(r.settings.get("interval_ms", 1000)))
    at_sized = _large_target(r, "large, sized interval", sized) if sized else None
    if at_sized is not None:
        at_sized.name += (f" (sized to this disk: twice the raw write of the direct path's state at "
                          f"{r.settings['large_raw_mib_s']:,.0f} MiB/s)")
        if at_1s is not None:
            at_sized.detail += f"; at {int(r.settings.get('interval_ms', 1000)):,} ms: {at_1s.measured}"
        out.append(at_sized)
    elif at_1s is not None:
        out.append(at_1s)
    return out


def _floor(a: dict) -> str:
    """The ack path's floor on this machine, in words: what any implementation pays (``AckPathStats.floor_p50``)."""
    if a.get("floor_p50") is None:
        return ""
    return (f"; this machine's floor for it: the 8 MiB durable as one file {_p(a['disk_floor_p50'], digits=1)}, "
            f"one PostgreSQL commit {_p(a['commit_floor_p50'], digits=1)} and one request with no database work "
            f"{_p(a['request_floor_p50'], digits=1)}: {_p(a['floor_p50'], digits=1)}")


def _large_target(r: StatePathsResult, what: str, interval: int) -> Target | None:
    dl, cl = r.run(r.large_runs, "direct", what), r.run(r.large_runs, "coordinator", what)
    if dl is None or cl is None:
        return None
    d_ok = dl.stats.p50 is not None and dl.stats.p50 <= interval
    c_ok = cl.stats.p50 is not None and cl.stats.p50 <= interval
    c_p50, c_bound = cl.stats.p50_or_bound
    return Target(f"large state: direct finishes within the {interval:,} ms interval, through the coordinator does not",
                  f"direct p50 {_p(dl.stats.p50)}, through the coordinator {_p(c_p50)}"
                  f"{' (lower bound)' if c_bound else ''}",
                  d_ok and not c_ok, f"persisted per checkpoint {_mib(dl.stats.persisted_avg)} direct, "
                  f"{_mib((dl.stats.persisted_avg or 0) / max(int(r.settings.get('parallelism', 1)), 1))} "
                  "per keyed subtask")


def markdown(r: StatePathsResult, command: str, machine: str) -> str:
    lines = ["## State straight into the blob store vs. through the coordinator\n",
             f"`{command}` — {machine}. Two coordinators on PostgreSQL, the same but for `OVERTAKE_STATE_WRITES`, "
             "alternating on one Spark session; unaligned checkpoints every "
             f"{r.settings['interval_ms']} ms under backpressure ({r.settings['record_cost_ms']:g} ms per record in "
             "each slow stage).\n"]
    lines += ["| target | measured | status | by how much |", "| --- | --- | --- | --- |"]
    lines += [t.row() for t in targets(r)]
    lines.append("")
    lines += ["### Checkpoint duration by shuffle depth\n",
              "| depth | path | p50 | p90 | completed | persisted per checkpoint | coordinator CPU per checkpoint |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for x in r.depth_runs:
        p50, bound = x.stats.p50_or_bound
        lines.append(f"| {x.what.removeprefix('depth ')} | {PATH_LABEL[x.path]} | {'> ' if bound else ''}{_p(p50)} | "
                     f"{_p(x.stats.p90)} | {x.stats.completed} | {_mib(x.stats.persisted_avg)} | "
                     f"{_p(x.cpu_per_checkpoint_ms, digits=1)} |")
    lines += ["", "### Coordinator CPU per checkpoint as in-flight bytes grow (depth 1)\n",
              "| network buffers | path | persisted per checkpoint | coordinator CPU per checkpoint | p50 |",
              "| --- | --- | ---: | ---: | ---: |"]
    for x in r.cpu_runs:
        lines.append(f"| {x.what} | {PATH_LABEL[x.path]} | {_mib(x.stats.persisted_avg)} | "
                     f"{_p(x.cpu_per_checkpoint_ms, digits=1)} | {_p(x.stats.p50_or_bound[0])} |")
    lines += ["", f"### Large state ({r.settings['large_seconds']:g} s per path)\n",
              "| interval | path | persisted per checkpoint | p50 | completed | aborted | unfinished at the end | "
              "coordinator CPU |",
              "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for x in r.large_runs:
        p50, bound = x.stats.p50_or_bound
        interval = r.settings["large_sized_interval_ms"] if x.what != "large" else r.settings["interval_ms"]
        lines.append(f"| {interval:,} ms | {PATH_LABEL[x.path]} | {_mib(x.stats.persisted_avg)} | "
                     f"{'> ' if bound else ''}{_p(p50)} | "
                     f"{x.stats.completed} | {x.stats.aborted} | {x.stats.unfinished} | "
                     f"{_p(x.stats.coordinator_cpu_s, ' s', 1)} |")
    if r.trigger is not None or r.ack_path is not None:
        lines += ["", "### Control path (no pipeline, the direct coordinator)\n"]
    if r.trigger is not None:
        t = r.trigger.as_dict()
        lines.append(f"Trigger delivery to {r.trigger.subscribers} event-stream subscribers, {r.trigger.rounds} "
                     f"rounds: last receipt {_p(t['p50_after_response'], digits=2)} p50 after the trigger's response, "
                     f"{_p(t['p50_to_last'], digits=2)} after its request was sent (the request commits the "
                     "checkpoint).\n")
    if r.ack_path is not None:
        a = r.ack_path.as_dict()
        lines.append(f"Ack path, {r.ack_path.subtasks} subtasks with {_mib(r.ack_path.channel_blob_bytes)} of state "
                     f"each, {r.ack_path.rounds} rounds per path: all acked {_p(a['relay_p50'], digits=1)} p50 direct "
                     f"through the host's ack relay ({r.ack_path.relay_requests / max(r.ack_path.rounds, 1):.1f} "
                     f"requests per checkpoint; durable write {_p(a['write_p50'], digits=1)}, all {r.ack_path.subtasks} "
                     f"durable {_p(a['relay_write_span_p50'], digits=1)} after the start, one file of the same bytes "
                     f"with one fsync {_p(a['disk_floor_p50'], digits=1)}, from the last durable to all acked "
                     f"{_p(a['relay_control_p50'], digits=1)}, ack until answered "
                     f"{_p(a['relay_ack_p50'], digits=1)}, the relay's request {_p(a['relay_request_p50'], digits=1)}, "
                     f"of which the coordinator's transaction {_p(a['relay_commit_p50'], digits=1)}), "
                     f"{_p(a['direct_p50'], digits=1)} direct with an ack "
                     f"request per subtask (ack request {_p(a['ack_p50'], digits=1)}), {_p(a['p50'], digits=1)} "
                     f"through the coordinator{_floor(a)}.\n")
    return "\n".join(lines) + "\n"


def write(r: StatePathsResult, out: Path, command: str, machine: str) -> str:
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(r, command, machine)
    (out / "state.md").write_text(text)
    data = {
        "settings": r.settings,
        "depth_runs": [x.as_dict() for x in r.depth_runs],
        "cpu_runs": [x.as_dict() for x in r.cpu_runs],
        "large_runs": [x.as_dict() for x in r.large_runs],
        "trigger": r.trigger.as_dict() if r.trigger is not None else None,
        "ack_path": r.ack_path.as_dict() if r.ack_path is not None else None,
        "targets": [asdict(t) for t in targets(r)],
    }
    (out / "state.json").write_text(json.dumps(data, indent=2, default=str))
    return text


def summary(r: StatePathsResult) -> str:
    d = [x for x in r.depth_runs if x.stats.p50 is not None]
    by = {(x.path, x.what): x.stats.p50 for x in d}
    parts = [f"{w}: {by.get(('direct', w)) or 0:,.0f} vs {by.get(('coordinator', w)) or 0:,.0f} ms"
             for w in sorted({x.what for x in d})]
    return "unaligned p50 direct vs through the coordinator — " + ", ".join(parts) if parts else "no runs"

