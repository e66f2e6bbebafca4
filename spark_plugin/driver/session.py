"""Starting a SparkSession for Overtake's pipelines: the one set-up the demo, the benchmarks and the tests share."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def spark_session(
    master: str | int,
    app_name: str,
    *,
    import_paths: Sequence[str | Path] | None = None,
    pin_python: bool = False,
    shuffle_partitions: int | None = 2,
    log_level: str = "ERROR",
    config: Mapping[str, str] | None = None,
    preload: bool = True,
) -> Any:
    """Gets or creates a SparkSession without UI or console progress bars and sets its log level.

    ``master`` is a Spark master URL, or a number of local slots (``4`` means ``local[4]``). The executors run this
    interpreter: ``PYSPARK_PYTHON`` is set to it unless already set, or always with ``pin_python`` (and the driver's
    too). ``import_paths`` (folders such as a checkout's root) go in front of ``PYTHONPATH``, here and in the
    executors' environment, so that their Python workers import the same modules. ``config`` adds Spark settings.
    With ``preload`` (the default) the executors' PySpark daemon is :mod:`spark_plugin.task.daemon`, which imports
    Overtake's task code once before it forks the Python workers, so a restarted stage's fresh workers do not each
    import it again (``spark.python.daemon.module``; a value in ``config`` wins).
    """
    if pin_python:
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(f"local[{master}]" if isinstance(master, int) else master).appName(app_name)
    builder = builder.config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
    if shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    if import_paths is not None:
        paths = [str(p) for p in import_paths] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        builder = builder.config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
    if preload:
        builder = builder.config("spark.python.daemon.module", "spark_plugin.task.daemon")
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark
