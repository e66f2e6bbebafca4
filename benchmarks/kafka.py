"""Kafka end to end (``overtake bench kafka``): latency from produce time to ``read_committed`` consumption through
KafkaSource → key_by → a slow keyed stage → KafkaSink, under backpressure, at a 1 s checkpoint interval; unaligned
exactly-once, aligned exactly-once and unaligned at-least-once, back to back in one run.

A producer thread writes keyed records at a fixed rate above what the slow stage takes (``rate`` against
``1000 / cost_ms`` records/s per keyed subtask; the ``waves`` variants alternate a busy and a calm rate, below it on
average), each carrying its produce time; a map chained to the source stamps
when the source read it. A ``read_committed`` consumer of the output topic measures, per record, consume time −
produce time (*end to end*, which includes the backlog waiting in the input topic: under sustained overload it grows
with the run by design) and consume time − read time (*pipeline*: from the source to a reader, the part the
checkpoints decide). Each variant gets fresh topics and the same rate and producing time; the producer starts once
the job's first checkpoint completed (the tasks are up). Local Spark, the coordinator embedded (SQLite), Tansu as
the broker (``spark_plugin.testing.kafka_broker``).

Writes ``kafka.md`` and ``kafka.json`` into ``--out``.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.report import write_scenario
from spark_plugin import Pipeline
from spark_plugin.connectors import KafkaSink, KafkaSource


@dataclass
class Settings:
    """What the scenario runs."""

    quick: bool = False
    seconds: float = 30.0
    """Producing time per variant."""
    rate: int = 600
    """Records per second the producer writes."""
    cost_ms: float = 2.0
    """Time the keyed stage spends per record: it takes at most ``1000 / cost_ms`` records/s per subtask."""
    keys: int = 100
    partitions: int = 2
    parallelism: int = 1
    interval_ms: int = 1000
    drain_s: float = 3.0
    """How long the job runs on after the producer stopped (a run below capacity delivers everything by then)."""
    startup_s: float = 120.0
    """How long to wait for the job's first completed checkpoint."""
    wave_rates: tuple[int, int] = (600, 150)
    """The ``waves`` load: records per second in its busy and its calm half (on average below what the stage takes,
    so the backlog of a busy half drains in the calm one and latency stays bounded)."""
    wave_period_s: float = 4.0
    """One busy half and one calm half."""
    fetch_wait_ms: int | None = 10
    """The source consumer's ``fetch.wait.max.ms`` (None: librdkafka's 500). Kafka answers a fetch as soon as a
    record arrives; Tansu, the broker this runs on, only when the wait runs out, so with 500 a caught-up source
    reads each record some 250 ms late on average. The reader's consumer uses 10 too."""
    variants: tuple[tuple[str, str, float | None, str], ...] = (
        ("unaligned", "exactly_once", None, "overload"), ("aligned", "exactly_once", None, "overload"),
        ("unaligned", "at_least_once", None, "overload"), ("unaligned", "exactly_once", 0.1, "overload"),
        ("unaligned", "exactly_once", None, "waves"), ("aligned", "exactly_once", None, "waves"),
    )
    """(policy, sink mode, buffer debloating target in s or None, load): ``overload`` produces ``rate`` throughout
    (sustained backpressure: the input topic's backlog grows for the whole run); ``waves`` alternates
    ``wave_rates`` (backpressure in the busy halves only, as most jobs see it). The debloated variant shows how much
    of the latency is the data in flight between the source and the slow stage."""

    @classmethod
    def quick_settings(cls, **over: Any) -> Settings:
        return cls(**{"quick": True, "seconds": 15.0, **over})


def floor_end_to_end(produced_ms: list[float], cost_ms: float, servers: int, triggers_ms: list[float]) -> list[float]:
    """What no exactly-once pipeline on checkpoints could beat, per record (ms from its produce time to being
    visible): records reach a stage of ``servers`` subtasks that each take exactly ``cost_ms`` per record (no
    other cost anywhere: no polling, no network, no serialization), first come first served, and become visible
    at the first checkpoint triggered at or after the stage let them go, as if that checkpoint completed and was
    committed the instant it was triggered. ``triggers_ms``: when the run's checkpoints were triggered. Records
    that no trigger follows are left out (the run measured nothing of them either).

    A floor for unaligned checkpoints: their barrier overtakes the stage's queue, so a record still queued or in
    the stage when a checkpoint is triggered belongs to a later one. (An aligned barrier waits behind the queue, so
    a checkpoint triggered before a queued record left can still carry it: not this floor.)"""
    import bisect
    import heapq

    triggers = sorted(triggers_ms)
    free = [0.0] * max(1, servers)  # when each subtask is next free
    out: list[float] = []
    for t in sorted(produced_ms):
        start = max(t, heapq.heappop(free))
        done = start + cost_ms
        heapq.heappush(free, done)
        i = bisect.bisect_left(triggers, done)
        if i < len(triggers):
            out.append(triggers[i] - t)
    return out


def _pct(xs: list[float], q: float) -> float | None:
    d = sorted(xs)
    return float(d[min(len(d) - 1, int(round(q * (len(d) - 1))))]) if d else None


@dataclass
class Variant:
    """One variant's run: what was produced and delivered, latencies (ms) and checkpoint durations (ms)."""

    policy: str
    mode: str
    debloat_s: float | None = None
    load: str = "overload"
    seconds: float = 0.0
    produced: int = 0
    delivered: int = 0
    """Distinct records a read_committed consumer saw before the job ended."""
    duplicates: int = 0
    end_to_end_ms: list[float] = field(default_factory=list, repr=False)
    pipeline_ms: list[float] = field(default_factory=list, repr=False)
    delivered_in_window: int = 0
    """Records consumed while the producer ran: the throughput's numerator."""
    checkpoints_ms: list[int] = field(default_factory=list)
    checkpoints_aborted: int = 0
    floor_ms: list[float] = field(default_factory=list, repr=False)
    """Per record (unaligned, exactly-once), the floor of its end-to-end latency (``floor_end_to_end``): the load's own
    queueing at the stage's bare cost plus the wait for the next checkpoint, for the run's produce and trigger
    times."""
    parts_ms: list[tuple[float, float, float, float]] = field(default_factory=list, repr=False)
    """Per record, its end to end in four parts (``Reader.parts``)."""
    calls: list[tuple[float, float, float, float]] = field(default_factory=list, repr=False)
    """Per record, its stage call's start and end, its read time and its produce time (``Reader.calls``)."""
    produced_ms: list[float] = field(default_factory=list, repr=False)
    triggers_ms: list[float] = field(default_factory=list, repr=False)
    servers: int = 1
    """Subtasks of the slow stage."""

    @property
    def label(self) -> str:
        debloat = "" if self.debloat_s is None else f", buffers debloated to {self.debloat_s:g} s"
        waves = ", waves" if self.load == "waves" else ""
        return f"{self.policy}, {self.mode.replace('_', '-')}{debloat}{waves}"

    def summary(self) -> dict[str, Any]:
        return {
            "policy": self.policy, "mode": self.mode, "debloat_s": self.debloat_s, "load": self.load,
            "produced": self.produced, "delivered": self.delivered,
            "duplicates": self.duplicates,
            "records_per_s": self.delivered_in_window / self.seconds if self.seconds else None,
            "end_to_end_p50": _pct(self.end_to_end_ms, 0.5), "end_to_end_p99": _pct(self.end_to_end_ms, 0.99),
            "pipeline_p50": _pct(self.pipeline_ms, 0.5), "pipeline_p99": _pct(self.pipeline_ms, 0.99),
            "floor_p50": _pct(self.floor_ms, 0.5), "floor_p99": _pct(self.floor_ms, 0.99),
            "checkpoints_completed": len(self.checkpoints_ms), "checkpoint_p50": _pct(self.checkpoints_ms, 0.5),
            "checkpoints_aborted": self.checkpoints_aborted,
            **self.breakdown(),
        }

    def breakdown(self) -> dict[str, Any]:
        """Where the slowest records' time went, and the stage's own pace.

        ``p99_parts``: over the records at or above the end-to-end p99, the mean of each part (in the input topic,
        to the stage, in the stage, from the stage to visible). ``stage_call_ms``: the mean stage call (the sleep and
        what it overshoots). ``stage_gap_ms``: the mean time between one call's end and the next one's start while
        the next record was already read (the stage had work: the runtime's cost per record between calls).
        ``stage_rate``: records/s the stage takes when it has work, ``1000 / (call + gap)``. ``floor_at_call_p99``:
        the floor (``floor_end_to_end``) with the stage's measured mean call instead of ``cost_ms``: what the
        checkpoints and the load allow at what one call really costs on this machine."""
        if not self.parts_ms:
            return {}
        ends = [sum(p) for p in self.parts_ms]
        cut = _pct(ends, 0.99)
        slow = [p for p, e in zip(self.parts_ms, ends, strict=True) if e >= cut]
        p99_parts = [sum(p[i] for p in slow) / len(slow) for i in range(4)]
        calls = sorted(self.calls)
        call_ms = sum(c[1] - c[0] for c in calls) / len(calls)
        pairs = list(zip(calls, calls[1:], strict=False)) if self.servers == 1 else []  # one subtask's calls only
        gaps = [b2 - e1 for (_, e1, _, _), (b2, _, read2, _) in pairs if read2 <= e1]
        gap_ms = sum(gaps) / len(gaps) if gaps else None
        # idle while the next record was produced but not yet read: the source behind a backlog in the topic
        starved = [b2 - e1 for (_, e1, _, _), (b2, _, read2, made2) in pairs if made2 <= e1 < read2]
        floor = (floor_end_to_end(self.produced_ms, call_ms, self.servers, self.triggers_ms)
                 if self.produced_ms and self.triggers_ms else [])
        return {
            "p99_parts": p99_parts, "stage_call_ms": call_ms, "stage_gap_ms": gap_ms,
            "stage_rate": 1000.0 / (call_ms + gap_ms) * self.servers if gap_ms is not None else None,
            "stage_starved_ms": sum(starved) if pairs else None, "stage_starved_times": len(starved),
            "stage_busy_ms": sum(c[1] - c[0] for c in calls),
            "floor_at_call_p99": _pct(floor, 0.99),
        }


# ------------------------------------------------------------------------------------------------ the pipeline


def _stamp_read(r: Any) -> tuple:
    return (r.key, r.value["seq"], r.value["t"], time.time() * 1000.0)


SPIN_S = 0.0003
"""The last part of the stage's call that it waits for on the clock instead of sleeping."""


class SlowStage:
    """The keyed stage: ``cost_ms`` per record, mostly asleep (so several engineers' CPUs are not the limit), the
    last :data:`SPIN_S` watching the clock: a 2 ms ``time.sleep`` takes some 2.2 ms here (the kernel wakes the
    thread late), so a stage that only slept cost 10 % more than the floor it is measured against assumes. It
    stamps each record with when its call began and ended (ms since the epoch), for the reader's breakdown."""

    def __init__(self, cost_ms: float) -> None:
        self.cost_s = cost_ms / 1000.0

    def __call__(self, key: Any, record: tuple, state: Any) -> list:
        began = time.time() * 1000.0
        until = time.perf_counter() + self.cost_s
        if self.cost_s > SPIN_S:
            time.sleep(self.cost_s - SPIN_S)
        while time.perf_counter() < until:
            pass
        return [(*record, began, time.time() * 1000.0)]


def kafka_pipeline(name: str, bootstrap: str, source_topic: str, sink_topic: str, s: Settings, mode: str) -> Pipeline:
    p = Pipeline(name, parallelism=s.parallelism)
    (
        p.source(KafkaSource(bootstrap, source_topic, start="earliest", value_deserializer="json",
                             key_deserializer="str",
                             config={} if s.fetch_wait_ms is None else {"fetch.wait.max.ms": s.fetch_wait_ms}),
                 id="kafka-in")
        .map(_stamp_read, id="stamp")
        .key_by(lambda r: r[0])
        .process(SlowStage(s.cost_ms), id="slow")
        .sink(KafkaSink(bootstrap, sink_topic, key=lambda r: r[0], value=list, mode=mode), id="kafka-out")
    )
    return p


# ------------------------------------------------------------------------------------------------ load and reader


class Producer(threading.Thread):
    """Writes ``rate`` keyed records per second for ``seconds`` (with ``waves``, ``(busy, calm, period)``: ``busy``
    records/s in the first half of each period, ``calm`` in the second), each value ``{"seq": n, "t": produce time
    ms}``."""

    def __init__(self, bootstrap: str, topic: str, rate: int, seconds: float, keys: int,
                 waves: tuple[int, int, float] | None = None) -> None:
        super().__init__(name="bench kafka producer", daemon=True)
        self.bootstrap, self.topic, self.rate, self.seconds, self.keys = bootstrap, topic, rate, seconds, keys
        self.waves = waves
        self.produced = 0
        self.produced_ms: list[float] = []
        """Each record's produce time (ms since the epoch), in order."""
        self.started = self.ended = 0.0

    def due(self, elapsed: float) -> int:
        """Records produced by ``elapsed`` seconds."""
        if self.waves is None:
            return int(elapsed * self.rate) + 1
        busy, calm, period = self.waves
        whole, part = divmod(elapsed, period)
        half = period / 2
        return int(whole * (busy + calm) * half + busy * min(part, half) + calm * max(part - half, 0.0)) + 1

    def run(self) -> None:
        from confluent_kafka import Producer as KProducer

        producer = KProducer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        self.started = time.monotonic()
        while (elapsed := time.monotonic() - self.started) < self.seconds:
            due = self.due(elapsed)
            while self.produced < due:
                n = self.produced
                now = time.time() * 1000.0
                self.produced_ms.append(now)
                value = json.dumps({"seq": n, "t": now}).encode()
                producer.produce(self.topic, value, key=str(n % self.keys).encode())
                self.produced += 1
            producer.poll(0)
            time.sleep(0.005)
        self.ended = time.monotonic()
        producer.flush(30)


class Reader(threading.Thread):
    """A ``read_committed`` consumer of every partition of ``topic`` from its start; per record, consume time −
    produce time and consume time − source read time, in ms."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        super().__init__(name="bench kafka reader", daemon=True)
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.seen: set[int] = set()
        self.duplicates = 0
        self.end_to_end: list[float] = []
        self.pipeline: list[float] = []
        self.consumed_at: list[float] = []
        self.parts: list[tuple[float, float, float, float]] = []
        """Per record (ms): in the input topic (read − produce), to the stage (its call's start − read), in the stage
        (the call), from the stage to visible (consume − the call's end); they add up to its end to end."""
        self.calls: list[tuple[float, float, float, float]] = []
        """Per record: its stage call's start and end, its read time and its produce time (ms since the epoch)."""
        self.stop = threading.Event()

    def run(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({
            "bootstrap.servers": self.bootstrap, "group.id": f"bench-reader-{uuid.uuid4().hex}",
            "isolation.level": "read_committed", "enable.auto.commit": False, "fetch.wait.max.ms": 10,
        })
        consumer.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])
        try:
            while not self.stop.is_set():
                for msg in consumer.consume(500, 0.05):
                    if msg.error() is not None:
                        continue
                    now = time.time() * 1000.0
                    _, seq, produced_ms, read_ms, began, ended = json.loads(msg.value())
                    if seq in self.seen:
                        self.duplicates += 1
                        continue
                    self.seen.add(seq)
                    self.end_to_end.append(now - produced_ms)
                    self.pipeline.append(now - read_ms)
                    self.parts.append((read_ms - produced_ms, began - read_ms, ended - began, now - ended))
                    self.calls.append((began, ended, read_ms, produced_ms))
                    self.consumed_at.append(time.monotonic())
        finally:
            consumer.close()


# ------------------------------------------------------------------------------------------------ one variant


def measure_variant(spark: Any, url: str, bootstrap: str, s: Settings, policy: str, mode: str,
                    debloat_s: float | None = None, status: Callable[[str], None] = lambda m: None,
                    load: str = "overload") -> Variant:
    """One variant on fresh topics: start the job, wait for its first checkpoint, produce for ``s.seconds``, let
    it run ``s.drain_s`` more, cancel it and collect."""
    from client.sync import OvertakeClient
    from contract.models import CheckpointConfig
    from spark_plugin.network.config import NetworkConfig
    from spark_plugin.testing.kafka_broker import create_topic

    tag = uuid.uuid4().hex[:8]
    source_topic = create_topic(bootstrap, f"bench-in-{tag}", s.partitions)
    sink_topic = create_topic(bootstrap, f"bench-out-{tag}", s.partitions)
    name = f"bench-kafka-{policy}-{mode}-{tag}"
    pipeline = kafka_pipeline(name, bootstrap, source_topic, sink_topic, s, mode)
    config = CheckpointConfig(interval=s.interval_ms, policy=policy, retained=2, timeout=600_000)
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = pipeline.run(
                spark, url, checkpoint=config, network=NetworkConfig(debloat_target_s=debloat_s),
                time_limit=s.startup_s + s.seconds + s.drain_s + 30,
            )
        except BaseException as e:  # noqa: BLE001 - a cancelled run may end in an error; reported if not cancelled
            outcome["error"] = e

    run = threading.Thread(target=target, name=f"bench {name}", daemon=True)
    run.start()
    v = Variant(policy, mode, debloat_s, load, servers=s.parallelism)
    cancelled = False
    with OvertakeClient(url) as client:
        job_id = None
        deadline = time.monotonic() + s.startup_s
        while run.is_alive() and time.monotonic() < deadline:
            if job_id is None:
                jobs = [j for j in client.list_jobs(limit=50).items if j.name == name]
                job_id = jobs[0].id if jobs else None
            elif any(c.status.value == "COMPLETED" for c in client.list_checkpoints(job_id, limit=100).items):
                break
            status(f"{v.label}: waiting for the job's first checkpoint")
            time.sleep(0.5)
        else:
            run.join(5)
            raise RuntimeError(f"{v.label}: the job completed no checkpoint within {s.startup_s:g} s"
                               + (f" ({outcome['error']})" if "error" in outcome else ""))
        reader = Reader(bootstrap, sink_topic, s.partitions)
        waves = (*s.wave_rates, s.wave_period_s) if load == "waves" else None
        producer = Producer(bootstrap, source_topic, s.rate, s.seconds, s.keys, waves)
        window_start_ms = time.time() * 1000
        reader.start()
        producer.start()
        while producer.is_alive():
            producer.join(1.0)
            status(f"{v.label}: {producer.produced:,} produced, {len(reader.seen):,} read")
        window_end_ms = time.time() * 1000
        time.sleep(s.drain_s)
        reader.stop.set()
        reader.join(10)
        client.cancel_job(job_id)
        cancelled = True
        run.join(60)
        cps = client.list_checkpoints(job_id, limit=1000).items
    if "error" in outcome and not cancelled:
        raise outcome["error"]
    window = [c for c in cps if window_start_ms <= c.trigger_timestamp <= window_end_ms]
    v.checkpoints_ms = [c.end_to_end_duration for c in window
                        if c.status.value == "COMPLETED" and c.end_to_end_duration is not None]
    v.checkpoints_aborted = sum(1 for c in window if c.status.value == "ABORTED"
                                and "job_ended" not in (c.failure_reason or ""))
    v.seconds = producer.ended - producer.started
    v.produced = producer.produced
    v.delivered = len(reader.seen)
    v.duplicates = reader.duplicates
    v.end_to_end_ms, v.pipeline_ms = reader.end_to_end, reader.pipeline
    v.parts_ms, v.calls = reader.parts, reader.calls
    v.delivered_in_window = sum(1 for t in reader.consumed_at if producer.started <= t <= producer.ended)
    if mode == "exactly_once" and policy == "unaligned":
        v.produced_ms, v.triggers_ms = producer.produced_ms, [float(c.trigger_timestamp) for c in cps]
        v.floor_ms = floor_end_to_end(producer.produced_ms, s.cost_ms, s.parallelism, v.triggers_ms)
    return v


def measure(spark: Any, url: str, bootstrap: str, s: Settings, done: Callable[[Variant], None] = lambda v: None,
            status: Callable[[str], None] = lambda m: None, into: list[Variant] | None = None) -> list[Variant]:
    """Every variant, back to back, on one Spark session, coordinator and broker."""
    runs = into if into is not None else []
    for policy, mode, debloat_s, load in s.variants:
        runs.append(measure_variant(spark, url, bootstrap, s, policy, mode, debloat_s, status, load))
        done(runs[-1])
    return runs


def tasks_needed(s: Settings) -> int:
    """Task slots one variant's job takes (every vertex that does not chain runs its own subtasks)."""
    from spark_plugin.plan.topology import subtask_specs

    return len(subtask_specs(kafka_pipeline("plan", "localhost:9092", "a", "b", s, "exactly_once").plan()))


def standalone(s: Settings, out: Path, command: str, machine: str, status: Callable[[str], None] = lambda m: None,
               done: Callable[[Variant], None] = lambda v: None, bootstrap: str | None = None) -> list[Variant]:
    """Start Tansu (unless ``bootstrap`` names a broker), an embedded coordinator and local Spark (or take the active
    session); run every variant; write the report after each."""
    from app.local import LocalCoordinator
    from benchmarks.timers import spark_session
    from spark_plugin.testing.kafka_broker import in_memory

    runs: list[Variant] = []
    with tempfile.TemporaryDirectory(prefix="overtake-bench-kafka-") as tmp:
        status("starting Tansu, the coordinator and Spark")
        broker = None if bootstrap else in_memory(Path(tmp))
        coordinator = LocalCoordinator(Path(tmp) / "coordinator", {"OVERTAKE_LOG_LEVEL": "WARNING"}).start()
        try:
            spark = spark_session(max(2, tasks_needed(s)))

            def each(v: Variant) -> None:
                write(runs, s, out, command, machine)
                done(v)

            measure(spark, coordinator.url, bootstrap or broker.bootstrap, s, each, status, into=runs)
        finally:
            coordinator.stop()
            if broker is not None:
                broker.stop()
    return runs


# ------------------------------------------------------------------------------------------------ report


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:,.0f} ms"


def headline(v: Variant) -> str:
    x = v.summary()
    return (f"end to end p50 {_ms(x['end_to_end_p50'])} p99 {_ms(x['end_to_end_p99'])} (floor p99 "
            f"{_ms(x['floor_p99'])}), pipeline p50 "
            f"{_ms(x['pipeline_p50'])} p99 {_ms(x['pipeline_p99'])}, {x['records_per_s'] or 0:,.0f} records/s, "
            f"checkpoint p50 {_ms(x['checkpoint_p50'])}")


def eos_over_alos(runs: list[Variant]) -> dict[str, float | None]:
    """Exactly-once against at-least-once, both unaligned: latency p50 and p99 ratios (pipeline part) and the
    throughput ratio."""
    by = {(v.policy, v.mode): v.summary() for v in runs if v.debloat_s is None and v.load == "overload"}
    eos, alos = by.get(("unaligned", "exactly_once")), by.get(("unaligned", "at_least_once"))
    if not eos or not alos:
        return {}

    def ratio(k: str) -> float | None:
        return eos[k] / alos[k] if eos[k] is not None and alos[k] else None

    return {k: ratio(k) for k in ("pipeline_p50", "pipeline_p99", "end_to_end_p99", "records_per_s")}


def markdown(runs: list[Variant], s: Settings, command: str = "", machine: str = "") -> str:
    head = " — ".join(f"`{command}`" if x is command else x for x in (command, machine) if x)
    head = f"{head}. " if head else ""
    capacity = 1000.0 / s.cost_ms * s.parallelism
    lines = [
        "## Kafka end to end: unaligned against aligned, exactly-once against at-least-once\n",
        f"{head}KafkaSource → key_by → a keyed stage taking {s.cost_ms:g} ms per record (at most "
        f"{capacity:,.0f} records/s) → KafkaSink, parallelism {s.parallelism}, {s.partitions} partitions per topic, "
        f"{s.rate:,} records/s produced for {s.seconds:g} s per variant (*waves*: {s.wave_rates[0]:,} records/s "
        f"and {s.wave_rates[1]:,} by turns, {s.wave_period_s / 2:g} s each), checkpoints every {s.interval_ms} ms. "
        "*End to end*: a read_committed consumer's time minus the record's produce time (it includes the backlog "
        "in the input topic, which grows for as long as the rate exceeds what the stage takes); *pipeline*: "
        "the consumer's time minus when the source read the record. *records/s*: records consumed while the "
        "producer ran. *checkpoint p50*: the coordinator's end-to-end duration of checkpoints triggered then. "
        "*floor p99* (unaligned, exactly-once): what no pipeline committing on these checkpoints could beat for this "
        "load: "
        f"each record queued first come first served at a stage costing exactly {s.cost_ms:g} ms per record and "
        "nothing else, then visible at the next checkpoint trigger as if it completed and committed at once.\n",
        "| variant | produced | delivered | dup. | end to end p50 | p99 | floor p99 | pipeline p50 | p99 | records/s "
        "| checkpoints | checkpoint p50 | aborted |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for v in runs:
        x = v.summary()
        lines.append(
            f"| {v.label} | {x['produced']:,} | {x['delivered']:,} | {x['duplicates']} | {_ms(x['end_to_end_p50'])} "
            f"| {_ms(x['end_to_end_p99'])} | {_ms(x['floor_p99'])} | {_ms(x['pipeline_p50'])} | {_ms(x['pipeline_p99'])} "
            f"| {x['records_per_s'] or 0:,.0f} | {x['checkpoints_completed']} | {_ms(x['checkpoint_p50'])} "
            f"| {x['checkpoints_aborted']} |"
        )
    lines += [
        "\nWhere the slowest 1 % of records (end to end at or above the p99) spent their time, on average: in the input "
        "topic (read − produce), on the way to the stage (the stage call's start − read: the network buffers and the "
        "stage's queue), in the stage's call, and from the stage to visible (consume − the call's end: the sink's "
        "wait for the checkpoint's commit, and the read). *call*: the stage's mean call (its sleep and what the sleep "
        "overshoots); *gap*: the mean time from a call's end to the next call's start while the next record was "
        "already read (the runtime's cost per record between calls); *stage rate*: what the stage takes while it "
        "has work, 1000 / (call + gap); *starved*: how long the stage sat idle, in all, while the next record was "
        "already produced but not yet read by the source (a backlog in the input topic the stage could have "
        "taken), and how many times; *floor at call p99*: the floor with the measured call instead of "
        f"{s.cost_ms:g} ms.\n",
        "| variant | input topic | to the stage | in the stage | to visible | call | gap | stage rate | starved "
        "| floor at call p99 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for v in runs:
        x = v.breakdown()
        if not x:
            continue
        parts = " | ".join(_ms(p) for p in x["p99_parts"])
        gap = "–" if x["stage_gap_ms"] is None else f"{x['stage_gap_ms']:.2f} ms"
        rate = "–" if x["stage_rate"] is None else f"{x['stage_rate']:,.0f}/s"
        starved = ("–" if x["stage_starved_ms"] is None
                   else f"{x['stage_starved_ms'] / 1000:,.1f} s ({x['stage_starved_times']:,} times)")
        lines.append(f"| {v.label} | {parts} | {x['stage_call_ms']:.2f} ms | {gap} | {rate} | {starved} "
                     f"| {_ms(x['floor_at_call_p99'])} |")
    r = eos_over_alos(runs)
    if r:
        def f(k: str) -> str:
            return "–" if r.get(k) is None else f"{r[k]:.2f}"

        lines.append(f"\nExactly-once / at-least-once (unaligned): pipeline p50 × {f('pipeline_p50')}, p99 × "
                     f"{f('pipeline_p99')}, end-to-end p99 × {f('end_to_end_p99')}, records/s × "
                     f"{f('records_per_s')}.")
    return "\n".join(lines) + "\n"


def write(runs: list[Variant], s: Settings, out: Path, command: str = "", machine: str = "") -> str:
    data = {"settings": asdict(s), "runs": [v.summary() for v in runs], "eos_over_alos": eos_over_alos(runs)}
    return write_scenario(out, "kafka", markdown(runs, s, command, machine), data)
