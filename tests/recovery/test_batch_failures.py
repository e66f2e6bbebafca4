"""Killed subtask processes in a batch pipeline on Spark: Parquet record batches in, a vectorized filter and a pandas
map, ``key_by("k")`` split by key group, running per-key aggregates a batch at a time, JSON lines out through the
exactly-once file sink. A random subtask's Python worker is SIGKILLed several times under each policy; the committed
output must then be one pass over the input: per key, the running counts only grow and the last one is the key's
row count (a sub-batch lost or applied twice would change it), the last sum the key's sum."""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_plugin import FixedDelay, ParquetSource, Pipeline, Supervisor
from spark_plugin.connectors import FileSink
from spark_plugin.testing.failure_injection import announce
from tests.recovery.pipelines import RELEASE, SMALL_BUFFERS, WorkerKiller
from tests.recovery.test_subtask_failures import KILLS, checkpoint_config

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FILES = 4
ROWS = 6000  # per file
KEYS = 40


class HeldParquetSource(ParquetSource):
    """The batch form of the Parquet source, holding back the last tenth of every file until the killer is done (so
    the run cannot end before every kill landed), announcing its worker's pid while it polls."""

    def __init__(self, paths: str, release: str) -> None:
        super().__init__(paths, batch_rows=100, batches=True)
        self.release_file = release  # not ``release``: that is the Source's method the runtime calls

    def poll(self, max_records: int):
        announce(str(Path(self.release_file).parent))
        return super().poll(max_records)

    def build_split_reader(self, split, position):
        return HeldFile(super().build_split_reader(split, position), self.release_file)


class HeldFile:
    def __init__(self, reader, release: str) -> None:
        self.reader, self.release = reader, release

    def poll(self, max_records: int):
        if self.reader.pos >= ROWS * 9 // 10 and not os.path.exists(self.release):
            return []
        return self.reader.poll(max_records)

    def wait_hint(self):
        return 0.05 if self.reader.pos >= ROWS * 9 // 10 and not os.path.exists(self.release) else None

    def __getattr__(self, name):
        return getattr(self.reader, name)


class SlowAnnounce:
    """Chained after the aggregate: announces its worker's pid and takes a while per batch (backpressure)."""

    def __init__(self, pid_dir: str) -> None:
        self.pid_dir = pid_dir

    def __call__(self, batch):
        announce(self.pid_dir)
        time.sleep(0.003)
        return batch


def write_input(directory: Path) -> dict:
    """The Parquet files, and per key its expected row count and sum of ``v``."""
    directory.mkdir()
    want: dict = defaultdict(lambda: [0, 0])
    for f in range(FILES):
        part = [{"k": f"key-{n % KEYS}", "v": n % 11} for n in range(f * ROWS, (f + 1) * ROWS)]
        pq.write_table(pa.Table.from_pylist(part), directory / f"part-{f}.parquet", row_group_size=500)
        for r in part:
            want[r["k"]][0] += 1
            want[r["k"]][1] += r["v"]
    return {k: tuple(v) for k, v in want.items()}


@pytest.mark.parametrize("policy", ["unaligned", "aligned"])
def test_killed_subtasks_leave_a_batch_pipelines_aggregates_exactly_once(spark, coordinator, tmp_path, policy):
    want = write_input(tmp_path / "in")
    pid_dir, out = tmp_path / "pids", tmp_path / "out"
    pid_dir.mkdir()
    p = Pipeline(f"batch-kill-{policy}", parallelism=2)
    (
        p.source(HeldParquetSource(str(tmp_path / "in"), str(pid_dir / RELEASE)), id="src")
        .filter(lambda b: b["v"].to_numpy() >= 0)
        .map_batches(lambda df: df.assign(v2=df.v * 2), format="pandas", id="double")
        .key_by("k")
        .aggregate({"v": ["sum", "count"]}, id="agg")
        .map_batches(SlowAnnounce(str(pid_dir)), id="slow")
        .rows(id="rows")
        .sink(FileSink(str(out)), id="out")
    )
    with WorkerKiller(pid_dir, 4, KILLS, seed=41) as killer:
        result = Supervisor(p, FixedDelay(max_restarts=KILLS + 3, delay=0.2)).run(
            spark, coordinator.url, checkpoint=checkpoint_config(policy), network=SMALL_BUFFERS
        )
    assert result.status == "finished"
    assert len(killer.killed) == KILLS, f"only {len(killer.killed)} of {KILLS} kills landed before the run ended"
    assert any(r.restored is not None for r in result.restarts), "no restart restored a checkpoint"
    counts: dict = defaultdict(list)
    last: dict = {}
    for f in sorted(out.glob("part-*.jsonl")):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            counts[row["k"]].append(row["v_count"])
            last[row["k"]] = (row["v_count"], row["v_sum"])
    assert last == want
    for k, cs in counts.items():
        assert cs == sorted(set(cs)), f"key {k}: its running counts repeat or go back: {cs[:20]}"
