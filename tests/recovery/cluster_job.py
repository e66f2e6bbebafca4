"""The driver of the cluster test, run as its own process as a user's ``spark-submit`` would: the keyed counter under
backpressure on a ``spark://`` master, supervised, fitted to the slots the cluster offers. Writes what happened as
JSON (``--result``).

    python -m tests.recovery.cluster_job --master spark://... --coordinator http://... --out DIR --pids DIR
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--master", required=True)
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--pids", required=True)
    ap.add_argument("--result", required=True)
    ap.add_argument("--count", type=int, default=20_000)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    from pyspark.sql import SparkSession

    from contract.models import CheckpointConfig
    from spark_plugin import FitToSlots, FixedDelay
    from spark_plugin.connectors import FileSink
    from spark_plugin.driver.supervisor import Supervisor
    from tests.recovery.pipelines import SMALL_BUFFERS, keyed_counter

    # the executors' Python: this interpreter (Overtake installed), as a user's spark-submit --conf would say
    os.environ["PYSPARK_PYTHON"] = sys.executable
    python_path = os.pathsep.join(dict.fromkeys([str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(":"))]))
    spark = (
        SparkSession.builder.master(args.master)
        .appName("overtake-cluster-test")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.memory", "512m")
        # the first attempt starts at full parallelism: the session waits for both workers' executors to register
        # (the test's workers start just before this driver, and on a loaded machine they register seconds apart)
        .config("spark.cores.max", "4")
        .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
        .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "120s")
        .config("spark.executorEnv.PYTHONPATH", python_path)
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    pipeline = keyed_counter("cluster", args.count, FileSink(args.out), args.pids, held=True)
    supervisor = Supervisor(
        pipeline, FixedDelay(max_restarts=3, delay=1.0),
        fit_to_slots=FitToSlots(min_parallelism=1, check_every=2.0, stabilization=5.0, resource_wait=120.0),
    )
    out: dict = {}
    try:
        result = supervisor.run(
            spark, args.coordinator, network=SMALL_BUFFERS,
            checkpoint=CheckpointConfig(interval=300, policy="unaligned", timeout=30_000, retained=100),
        )
        out = {"status": result.status, "job_id": result.job_id,
               "restarts": [r.error for r in result.restarts]}
    except BaseException as e:  # noqa: BLE001 - the test reads why
        out = {"status": "error", "error": f"{type(e).__name__}: {e}"}
    finally:
        Path(args.result).write_text(json.dumps(out))
        spark.stop()
    return 0 if out.get("status") == "finished" else 1


if __name__ == "__main__":
    sys.exit(main())
