"""The driver of the cluster test, run as its own process as a user's ``spark-submit`` would: the keyed counter under
backpressure on a ``spark://`` master, supervised with the default restart (which waits for lost slots) or, with
``--fit-to-slots``, fitted to the slots the cluster offers; ``retained`` checkpoints (default 1). Writes what
happened as JSON (``--result``).

    python -m tests.recovery.cluster_job --master spark://... --coordinator http://... --out DIR --pids DIR
"""

from __future__ import annotations

import argparse
import json
import logging
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
    ap.add_argument("--fit-to-slots", action="store_true", help="scale down to the slots left instead of waiting")
    ap.add_argument("--retained", type=int, default=1)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    from contract.models import CheckpointConfig
    from spark_plugin import FitToSlots, FixedDelay
    from spark_plugin.connectors import FileSink
    from spark_plugin.driver.session import spark_session
    from spark_plugin.driver.supervisor import Supervisor
    from tests.recovery.pipelines import SMALL_BUFFERS, keyed_counter

    # the executors' Python: this interpreter (Overtake installed), as a user's spark-submit --conf would say
    spark = spark_session(args.master, "overtake-cluster-test", import_paths=[ROOT], pin_python=True, config={
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.memory": "512m",
        # the first attempt starts at full parallelism: the session waits for both workers' executors to register
        # (the test's workers start just before this driver, and on a loaded machine they register seconds apart)
        "spark.cores.max": "4",
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
    })
    pipeline = keyed_counter("cluster", args.count, FileSink(args.out), args.pids, held=True)
    fit = FitToSlots(min_parallelism=1, check_every=2.0, stabilization=5.0, resource_wait=120.0)
    # the default restart (no fit_to_slots) waits for the lost worker's slots, up to the default slot_wait
    supervisor = Supervisor(pipeline, FixedDelay(max_restarts=3, delay=1.0), fit_to_slots=fit if args.fit_to_slots else None)
    out: dict = {}
    try:
        result = supervisor.run(
            spark, args.coordinator, network=SMALL_BUFFERS,
            checkpoint=CheckpointConfig(interval=300, policy="unaligned", timeout=30_000, retained=args.retained),
        )
        out = {"status": result.status, "job_id": result.job_id,
               "restarts": [{"error": r.error, "failed_attempt": r.failed_attempt, "attempt": r.attempt,
                             "restore_from": r.restore_from, "restored": r.restored} for r in result.restarts]}
    except BaseException as e:  # noqa: BLE001 - the test reads why
        out = {"status": "error", "error": f"{type(e).__name__}: {e}"}
    finally:
        Path(args.result).write_text(json.dumps(out))
        spark.stop()
    return 0 if out.get("status") == "finished" else 1


if __name__ == "__main__":
    sys.exit(main())
