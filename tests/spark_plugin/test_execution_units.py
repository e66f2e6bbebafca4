"""Pieces of the Spark execution that need no Spark: slot counting and the run result."""

from __future__ import annotations

import os

import pytest

from spark_plugin.driver.run import RunResult, task_slots
from spark_plugin.task.subtask import SubtaskResult


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


def test_a_failed_stage_is_summed_up_by_the_exception_a_task_raised_not_a_source_line_naming_it():
    from spark_plugin.driver.run import _short

    spark_error = Exception(
        "org.apache.spark.SparkException: Job aborted due to stage failure\n"
        '  File "subtask.py", line 280, in _check_failures\n'
        '    raise SubtaskFailed(f"{self.spec.name}: {failure}")\n'
        "spark_plugin.task.subtask.SubtaskFailed: count[1]: the coordinator has been unreachable for 121s\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:600)\n"
    )
    assert _short(spark_error) == (
        "spark_plugin.task.subtask.SubtaskFailed: count[1]: the coordinator has been unreachable for 121s"
    )
    missing_module = Exception(
        "org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 0.0 failed: "
        "org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was thrown from the Python "
        "worker: Traceback (most recent call last):\n"
        '  File "worker.py", line 4197, in invoke_udf\n'
        "ModuleNotFoundError: No module named 'httpx'\n"
        " SQLSTATE: 38000\n"
        "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala)\n"
    )
    assert _short(missing_module) == "ModuleNotFoundError: No module named 'httpx'"
    assert _short(Exception("org.apache.spark.SparkException: lost executor 1")).startswith(
        "org.apache.spark.SparkException: lost executor 1"
    )
