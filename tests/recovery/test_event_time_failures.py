"""Killed subtask processes under event time: for each barrier policy, a random subtask's Python worker is SIGKILLed
several times in one run of a windowed aggregate under backpressure; the supervisor restarts from the latest
checkpoint (watermarks, timers and window contents in it) and the committed output equals, exactly, what Spark SQL's
``groupBy(window(...))`` computes over the same input: no window lost, none fired twice, no record dropped as late.

``OVERTAKE_EVENT_TIME_KILLS`` sets the kills per policy (default 3). The sources hold back their last tenth until
every kill landed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from client.sync import OvertakeClient
from contract.models import CheckpointConfig
from spark_plugin import Pipeline
from spark_plugin.api.watermarks import WatermarkStrategy
from spark_plugin.api.windows import TumblingEventTimeWindows
from spark_plugin.connectors import FileSink
from spark_plugin.connectors.event_sequence import EventSequenceSource
from spark_plugin.driver.restart import FixedDelay
from spark_plugin.driver.supervisor import Supervisor
from spark_plugin.testing.failure_injection import announce
from tests.recovery.pipelines import RELEASE, SMALL_BUFFERS, WorkerKiller
from tests.spark_plugin.event_time_reference import flat, spark_sql_windows

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KILLS = int(os.environ.get("OVERTAKE_EVENT_TIME_KILLS", "3"))
TASKS = 4  # two source subtasks, two window subtasks (each chained with its sink)
PER_PARTITION = 4000


class HeldEventSource(EventSequenceSource):
    """An ``EventSequenceSource`` that keeps the last tenth of each partition until the file ``release`` exists."""

    def __init__(self, release: str, **kw) -> None:
        super().__init__(**kw)
        self.release_file = release  # not ``release``: that is the Source's method the runtime calls
        self.pid_dir = str(Path(release).parent)

    def poll(self, max_records: int):
        announce(self.pid_dir)
        return super().poll(max_records)

    def build_split_reader(self, split, position):
        return HeldPartition(super().build_split_reader(split, position), self.release_file, self.count * 9 // 10)


class HeldPartition:
    """A partition's reader that stops at record ``hold`` until the file ``release`` exists."""

    def __init__(self, reader, release: str, hold: int) -> None:
        self.reader, self.release, self.hold = reader, release, hold
        self.released = False

    def _held(self) -> bool:
        if not self.released and os.path.exists(self.release):
            self.released = True
        return not self.released and self.reader.n >= self.hold

    def poll(self, max_records: int):
        if self._held():
            return []
        if not self.released:
            max_records = min(max_records, self.hold - self.reader.n)
        return self.reader.poll(max_records)

    def wait_hint(self) -> float | None:
        return 0.05 if not self.released else self.reader.wait_hint()

    def __getattr__(self, name):
        return getattr(self.reader, name)


class SlowCountAndSum:
    """The window's aggregate: slow (backpressure), counts and sums ``n``, announces its task's pid."""

    def __init__(self, pid_dir: str) -> None:
        self.pid_dir = pid_dir

    def __call__(self, acc, record):
        announce(self.pid_dir)
        time.sleep(0.0003)
        return (acc[0] + 1, acc[1] + record[3])


def zero():
    return (0, 0)


def ts(r):
    return r[1]


def key(r):
    return r[0]


def source_kwargs() -> dict:
    return dict(count=PER_PARTITION, partitions=4, keys=16, skew=1.0, interval_ms=10, speeds=[1, 2, 1, 3],
                disorder_ms=200)


def windowed_counter(name: str, out: Path, pid_dir: Path) -> Pipeline:
    source = HeldEventSource(str(pid_dir / RELEASE), **source_kwargs())
    p = Pipeline(name, parallelism=2)
    (
        p.source(source, id="src", watermarks=WatermarkStrategy.for_bounded_out_of_orderness(200, ts))
        .key_by(key)
        .window(TumblingEventTimeWindows.of(1000))
        .aggregate(zero, SlowCountAndSum(str(pid_dir)), id="win")
        .sink(FileSink(str(out)), id="out")
    )
    return p


def file_rows(directory: Path) -> list:
    return [tuple(json.loads(line)) for f in sorted(directory.glob("part-*.jsonl")) for line in f.read_text().splitlines()]


@pytest.mark.parametrize("policy", ["aligned", "unaligned", "aligned_then_unaligned"])
def test_killed_subtasks_leave_windowed_aggregates_equal_to_spark_sql(spark, coordinator, tmp_path, policy):
    pid_dir, out = tmp_path / "pids", tmp_path / "out"
    pid_dir.mkdir()
    pipeline = windowed_counter(f"evt-kill-{policy}", out, pid_dir)
    config = CheckpointConfig(interval=400, policy=policy, timeout=30_000, retained=3,
                              alignment_timeout=100 if policy == "aligned_then_unaligned" else None)
    with WorkerKiller(pid_dir, TASKS, KILLS, seed=31) as killer:
        result = Supervisor(pipeline, FixedDelay(max_restarts=KILLS + 3, delay=0.2)).run(
            spark, coordinator.url, checkpoint=config, network=SMALL_BUFFERS
        )
    assert result.status == "finished"
    assert len(killer.killed) == KILLS, f"only {len(killer.killed)} of {KILLS} kills landed before the run ended"
    assert any(r.restored is not None for r in result.restarts), "no restart restored a checkpoint"
    with OvertakeClient(coordinator.url) as client:
        assert client.get_job(result.job_id).status.value == "FINISHED"
    records = EventSequenceSource(**source_kwargs()).all_records()
    got = flat((k, s, e, tuple(v)) for k, s, e, v in file_rows(out))
    assert got == spark_sql_windows(spark, records, size_ms=1000)
