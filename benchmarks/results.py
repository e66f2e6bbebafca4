"""What an ``overtake bench`` run measured (``BenchResults``), the facts of the machine it ran on, and how the reports
write durations, bytes and ratios."""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.disk import DiskStats
from benchmarks.flip76 import RunStats, Settings
from contract.units import human_bytes

DISK_BAR = 0.7
"""Channel-state writes reach at least this share of the raw sequential write bandwidth of the same disk."""


@dataclass
class BenchResults:
    settings: Settings
    machine: dict[str, str] = field(default_factory=dict)
    command: str = ""
    started: str = ""
    seconds: float = 0.0
    backpressure: list[RunStats] = field(default_factory=list)
    no_checkpoints_backpressure: RunStats | None = None
    free: list[RunStats] = field(default_factory=list)
    disk: DiskStats | None = None
    acks: Any = None
    ack_path: list = field(default_factory=list)
    inflight: Any = None
    """Scenario 8 (``benchmarks.inflight.InflightResult``)."""
    errors: dict[str, str] = field(default_factory=dict)
    plots: list[str] = field(default_factory=list)

    def run_of(self, policy: str, depth: int) -> RunStats | None:
        return next((r for r in self.backpressure if r.policy == policy and r.depth == depth), None)


# ------------------------------------------------------------------------------------------------ machine


def _first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        text = (out.stdout or out.stderr).strip()
        return text.splitlines()[0] if text else "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def machine_facts(spark: Any = None, pg_admin_url: str | None = None) -> dict[str, str]:
    facts: dict[str, str] = {}
    facts["cores"] = str(os.cpu_count())
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
        facts["CPU"] = model
    except (OSError, StopIteration):
        facts["CPU"] = platform.processor() or "?"
    try:
        kb = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal")))
        facts["memory"] = f"{kb / (1 << 20):.1f} GiB"
    except (OSError, StopIteration):
        facts["memory"] = "?"
    facts["OS"] = platform.platform()
    facts["Python"] = platform.python_version()
    try:
        import pyspark

        facts["PySpark"] = pyspark.__version__
    except ImportError:
        facts["PySpark"] = "?"
    java = None
    if spark is not None:
        try:
            jvm = spark.sparkContext._jvm
            java = f"{jvm.System.getProperty('java.vendor')} {jvm.System.getProperty('java.version')}"
        except Exception:  # noqa: BLE001
            java = None
    facts["Java"] = java or _first_line(["java", "-version"])
    if pg_admin_url:
        try:
            import psycopg

            with psycopg.connect(pg_admin_url, connect_timeout=5) as c:
                facts["PostgreSQL"] = c.execute("SHOW server_version").fetchone()[0]
        except Exception as e:  # noqa: BLE001
            facts["PostgreSQL"] = f"unreachable ({type(e).__name__})"
    facts["load average at start"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    facts["overtake commit"] = _first_line(["git", "-C", str(Path(__file__).resolve().parent), "rev-parse",
                                             "--short", "HEAD"])
    return facts


# ------------------------------------------------------------------------------------------------ formatting


def ms(v: float | None, bound: bool = False) -> str:
    if v is None:
        return "–"
    s = f"{v / 1000:,.1f} s" if v >= 10_000 else f"{v:,.0f} ms"
    return ("> " + s) if bound else s


def nbytes(v: float | None) -> str:
    return human_bytes(v, "–")


def ratio(a: float | None, b: float | None, bound: bool = False) -> str:
    if a is None or b is None or b == 0:
        return "–"
    r = a / b
    s = f"{r:,.1f}×" if r >= 10 else f"{r:,.2f}×"
    return ("≥ " + s) if bound else s
