"""PyFlink's side of ``python -m benchmarks.pyflink_side``: the FLIP-76 backpressured job of ``overtake bench``
(``benchmarks.flip76.backpressured_pipeline``) in PyFlink 2.3's thread mode, its unaligned checkpoints' figures
read from the MiniCluster's REST API.

Run with the Python of PyFlink's own environment (``scripts/pyflink-env.sh``) in isolated mode (``python -I``): it
imports nothing of the project. The job: an unbounded sequence (Java) → a Python map to ``(key, seq, payload)``
(``keys`` keys round robin, ``payload`` bytes) → ``depth`` times (``key_by`` key → a keyed process function that
sleeps ``cost_ms`` per record and counts per key in a ``ValueState``) → a discarding sink; every operator at
``parallelism``, unaligned checkpoints every ``interval_ms``. It runs ``seconds`` and is cancelled.

``--storage memory`` (the default, what PyFlink does when no checkpoint directory is set) keeps every checkpoint in
the JobManager's heap: nothing is written anywhere. ``--storage files`` writes them as files into a directory of the
working directory (``execution.checkpointing.dir``), as a job that must survive its JobManager does; Flink writes
those files without an fsync, so even that is not durable against a power loss as Overtake's checkpoints are.

Prints one JSON line: the completed checkpoints' end-to-end durations and persisted bytes after ``warm_up`` of
them, how many were triggered and completed, and the records the last slow stage took (its ``numRecordsIn``) per
second of the run.
"""

from __future__ import annotations

import argparse
import json
import os
import site
import socket
import sys
import time
from urllib.request import urlopen


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(base: str, path: str) -> dict:
    with urlopen(base + path, timeout=5) as r:
        return json.loads(r.read())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--depth", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--interval-ms", type=int, default=1000)
    ap.add_argument("--cost-ms", type=float, default=1.0)
    ap.add_argument("--keys", type=int, default=128)
    ap.add_argument("--payload", type=int, default=100)
    ap.add_argument("--warm-up", type=int, default=1, help="completed checkpoints left out first (as overtake bench)")
    ap.add_argument("--storage", choices=("memory", "files"), default="memory")
    a = ap.parse_args()
    # thread mode embeds CPython in the JVM (PEMJA), which finds this environment's packages only through PYTHONPATH
    os.environ["PYTHONPATH"] = os.pathsep.join([*site.getsitepackages(), os.environ.get("PYTHONPATH", "")])

    from pyflink.common import Configuration, Types, WatermarkStrategy
    from pyflink.datastream import StreamExecutionEnvironment
    from pyflink.datastream.connectors.number_seq import NumberSequenceSource
    from pyflink.datastream.functions import KeyedProcessFunction, MapFunction, RuntimeContext
    from pyflink.datastream.state import ValueStateDescriptor

    keys, payload, cost = a.keys, b"x" * a.payload, a.cost_ms / 1000.0

    class ToRecord(MapFunction):
        def map(self, seq):
            return seq % keys, seq, payload

    class Slow(KeyedProcessFunction):
        def open(self, runtime_context: RuntimeContext) -> None:
            self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))

        def process_element(self, value, ctx):
            time.sleep(cost)
            self.count.update((self.count.value() or 0) + 1)
            yield value

    record = Types.TUPLE([Types.LONG(), Types.LONG(), Types.PRIMITIVE_ARRAY(Types.BYTE())])
    config = Configuration()
    config.set_string("python.execution-mode", "thread")
    config.set_string("python.executable", sys.executable)
    config.set_string("python.client.executable", sys.executable)
    config.set_string("restart-strategy.type", "none")
    rest = _free_port()
    config.set_string("rest.port", str(rest))
    config.set_string("web.checkpoints.history", "10000")
    if a.storage == "files":
        config.set_string("execution.checkpointing.storage", "filesystem")
        config.set_string("execution.checkpointing.dir", "file://" + os.path.abspath("checkpoints"))
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(a.parallelism)
    env.enable_checkpointing(a.interval_ms)
    env.get_checkpoint_config().enable_unaligned_checkpoints()
    stream = (env.from_source(NumberSequenceSource(0, 2**62), WatermarkStrategy.no_watermarks(), "source")
              .map(ToRecord(), output_type=record))
    for d in range(1, a.depth + 1):
        stream = stream.key_by(lambda r: r[0], key_type=Types.LONG()).process(Slow(), output_type=record).name(
            f"slow-{d}")
    stream.filter(lambda r: False).print()  # nothing passes: a sink that discards
    client = env.execute_async(f"overtake-bench-pyflink-backpressure-{a.depth}")
    base = f"http://127.0.0.1:{rest}"
    job = str(client.get_job_id())
    seen: dict[int, dict] = {}
    started = time.monotonic()
    records = 0
    while time.monotonic() - started < a.seconds:
        time.sleep(0.5)
        try:
            for c in _get(base, f"/jobs/{job}/checkpoints").get("history", []):
                seen[c["id"]] = c
            vertices = _get(base, f"/jobs/{job}")["vertices"]
            last = [v for v in vertices if f"slow-{a.depth}" in v["name"]]
            if last:
                records = last[0]["metrics"]["read-records"]
        except (OSError, ValueError, KeyError):
            pass  # not up yet: the next poll
    elapsed = time.monotonic() - started
    try:
        storage_seen = _get(base, f"/jobs/{job}/checkpoints/config").get("checkpoint_storage")
    except (OSError, ValueError):
        storage_seen = None
    client.cancel().result()
    files = sum(len(fs) for _, _, fs in os.walk("checkpoints")) if a.storage == "files" else 0
    done = sorted((c for c in seen.values() if c.get("status") == "COMPLETED"), key=lambda c: c["id"])
    after = done[a.warm_up:]
    print(json.dumps({"depth": a.depth, "storage": a.storage, "storage_seen": storage_seen, "files_left": files,
                      "seconds": elapsed, "records": records, "throughput": records / elapsed,
                      "triggered": len(seen), "completed": len(done),
                      "durations_ms": [c["end_to_end_duration"] for c in after],
                      "persisted_bytes": [c.get("persisted_data", 0) for c in after]}), flush=True)
    os._exit(0)  # the JVM gateway's threads would hold the process


if __name__ == "__main__":
    main()
