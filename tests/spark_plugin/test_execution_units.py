"""Pieces of the Spark execution that need no Spark: slot counting and the run result."""

from __future__ import annotations

import os

import pytest

from spark_plugin.execution import RunResult, task_slots
from spark_plugin.subtask import SubtaskResult


class FakeConf:
    def __init__(self, cpus: str = "1") -> None:
        self.cpus = cpus

    def get(self, key: str, default: str) -> str:
        return self.cpus if key == "spark.task.cpus" else default


class FakeContext:
    def __init__(self, master: str, default_parallelism: int = 8, cpus: str = "1") -> None:
        self.master = master
        self.defaultParallelism = default_parallelism
        self._conf = FakeConf(cpus)

    def getConf(self) -> FakeConf:  # noqa: N802 - Spark's name
        return self._conf


@pytest.mark.parametrize(
    ("master", "cpus", "slots"),
    [("local", "1", 1), ("local[4]", "1", 4), ("local[4]", "2", 2), ("local[6,3]", "1", 6),
     ("spark://host:7077", "1", 8), ("spark://host:7077", "4", 2)],
)
def test_task_slots_follow_the_master_and_task_cpus(master, cpus, slots):
    assert task_slots(FakeContext(master, 8, cpus)) == slots


def test_local_star_counts_the_machine_cores():
    assert task_slots(FakeContext("local[*]")) == (os.cpu_count() or 1)


def test_run_result_collects_a_sinks_records_from_every_subtask():
    subtasks = [
        SubtaskResult("sink", 1, "finished", outputs={"out": {"records": [3, 4]}}),
        SubtaskResult("sink", 0, "finished", outputs={"out": {"records": [1, 2]}}),
        SubtaskResult("src", 0, "finished"),
    ]
    assert RunResult(1, 1, "finished", subtasks).outputs("out") == [1, 2, 3, 4]
