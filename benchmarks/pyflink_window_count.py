"""PyFlink's side of ``overtake bench batches``: the same keyed tumbling-window count, per record, in PyFlink's best
configuration for Python functions (thread mode: the functions run in the TaskManager's JVM process through PEMJA,
no gRPC hop; the operators chained).

Run by the benchmark with the Python of PyFlink's own environment (``scripts/pyflink-env.sh``), in isolated mode
(``python -I``), so it imports nothing of the project: the events are the benchmark's, made from their index as
``benchmarks.batches.write_events`` writes them (event ``g`` of ``events`` is row ``i = g % per_file`` of file
``f = g // per_file``: key ``(i + f) % keys``, ts ``g`` ms, value ``(i * 31 + f) % 97``), by a
``NumberSequenceSource`` (Java) and a Python map. PyFlink thus reads no Parquet; Overtake's record path does, so
the comparison is in PyFlink's favour by that decoding.

The job: sequence → map to ``(key, ts, value)`` → a bounded-out-of-orderness watermark of 100 ms on ``ts`` (a Python
timestamp assigner) → ``key_by`` key → tumbling event-time windows → an aggregate counting → ``execute_and_collect``.
Unaligned checkpoints every ``--interval-ms``, as Overtake's runs take them.

*Time*: from the first event a map subtask handled (each subtask writes the time of its first event into
``--stamps``) to the last window's result leaving its window operator (the result carries it), as Overtake's is
from its first sink subtask opening to its last closing; the JVM's start and the job's submission are outside it.

Prints one JSON line: ``{"events", "seconds", "windows", "counted", "parallelism", "mode"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, required=True)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--keys", type=int, default=100)
    ap.add_argument("--window-ms", type=int, default=10_000)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--interval-ms", type=int, default=1000)
    ap.add_argument("--mode", choices=("thread", "process"), default="thread")
    ap.add_argument("--stamps", required=True, help="a directory for the map subtasks' first-event times")
    a = ap.parse_args()
    # thread mode embeds CPython in the JVM (PEMJA), which finds this environment's packages only through PYTHONPATH
    import site

    os.environ["PYTHONPATH"] = os.pathsep.join([*site.getsitepackages(), os.environ.get("PYTHONPATH", "")])

    from pyflink.common import Configuration, Duration, Types, WatermarkStrategy
    from pyflink.common.time import Time
    from pyflink.common.watermark_strategy import TimestampAssigner
    from pyflink.datastream import StreamExecutionEnvironment
    from pyflink.datastream.connectors.number_seq import NumberSequenceSource
    from pyflink.datastream.functions import AggregateFunction, MapFunction, RuntimeContext
    from pyflink.datastream.window import TumblingEventTimeWindows

    per_file = -(-a.events // a.files)
    keys = a.keys
    stamps = a.stamps

    class ToEvent(MapFunction):
        def open(self, runtime_context: RuntimeContext) -> None:
            # thread mode's runtime context has no subtask index: a name of its own per subtask instead
            self.index = uuid.uuid4().hex
            self.first = True

        def map(self, g):
            if self.first:
                self.first = False
                with open(os.path.join(stamps, f"first-{self.index}"), "w") as f:
                    f.write(repr(time.time()))
            f_, i = divmod(g, per_file)
            return (i + f_) % keys, g, (i * 31 + f_) % 97

    class EventTime(TimestampAssigner):
        def extract_timestamp(self, value, record_timestamp: int) -> int:
            return value[1]

    class Count(AggregateFunction):
        def create_accumulator(self):
            return 0

        def add(self, value, accumulator):
            return accumulator + 1

        def get_result(self, accumulator):
            return accumulator, time.time()

        def merge(self, acc_a, acc_b):
            return acc_a + acc_b

    config = Configuration()
    config.set_string("python.execution-mode", a.mode)
    # the JVM starts Python workers (and asks where PyFlink is) with this interpreter, not the first on PATH
    config.set_string("python.executable", sys.executable)
    config.set_string("python.client.executable", sys.executable)
    config.set_string("restart-strategy.type", "none")  # a failing job fails, it does not restart forever
    rest = _free_port()
    config.set_string("rest.port", str(rest))  # the MiniCluster's REST API, read for the checkpoints' statistics
    config.set_string("web.checkpoints.history", "10000")
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(a.parallelism)
    env.enable_checkpointing(a.interval_ms)
    env.get_checkpoint_config().enable_unaligned_checkpoints()
    events = (
        env.from_source(NumberSequenceSource(0, a.events - 1), WatermarkStrategy.no_watermarks(), "events")
        .map(ToEvent(), output_type=Types.TUPLE([Types.LONG(), Types.LONG(), Types.LONG()]))
        .assign_timestamps_and_watermarks(
            WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(100))
            .with_timestamp_assigner(EventTime()))
    )
    counts = (
        events.key_by(lambda e: e[0], key_type=Types.LONG())
        .window(TumblingEventTimeWindows.of(Time.milliseconds(a.window_ms)))
        .aggregate(Count(), accumulator_type=Types.LONG(),
                   output_type=Types.TUPLE([Types.LONG(), Types.DOUBLE()]))
    )
    windows = counted = 0
    last = 0.0
    checkpoints = Checkpoints(rest)
    checkpoints.start()
    try:
        with counts.execute_and_collect("overtake-bench-pyflink-window-count") as results:
            for n, at in results:
                windows += 1
                counted += n
                last = max(last, at)
    finally:
        checkpoints.stop()
    firsts = [float(open(os.path.join(stamps, x)).read()) for x in os.listdir(stamps) if x.startswith("first-")]
    if not firsts:
        raise SystemExit("no map subtask wrote the time of its first event")
    done = [c for c in checkpoints.seen.values() if c.get("status") == "COMPLETED"]
    print(json.dumps({"events": a.events, "seconds": last - min(firsts), "windows": windows, "counted": counted,
                      "parallelism": a.parallelism, "mode": a.mode,
                      "checkpoints_ms": [c["end_to_end_duration"] for c in done],
                      "persisted_bytes": [c.get("persisted_data", 0) for c in done],
                      "stored_bytes": [c.get("state_size", 0) for c in done]}))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Checkpoints(threading.Thread):
    """Reads the running job's checkpoint history from the MiniCluster's REST API twice a second, keeping every
    checkpoint it saw by id (the job's statistics go with the MiniCluster when the job ends)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.base = f"http://127.0.0.1:{port}"
        self.seen: dict[int, dict] = {}
        self.stopped = threading.Event()

    def _get(self, path: str) -> dict:
        from urllib.request import urlopen

        with urlopen(self.base + path, timeout=2) as r:
            return json.loads(r.read())

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            self.poll()

    def poll(self) -> None:
        try:
            for job in self._get("/jobs").get("jobs", []):
                for c in self._get(f"/jobs/{job['id']}/checkpoints").get("history", []):
                    self.seen[c["id"]] = c
        except (OSError, ValueError, KeyError):
            pass  # not up yet, or gone with the job: the next poll or none

    def stop(self) -> None:
        self.stopped.set()
        self.join(5)


if __name__ == "__main__":
    main()
