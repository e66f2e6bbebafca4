"""Event time in the subtask loop, driven step by step with scripted channel contents (no sockets): watermarks in
band, due timers fired between barriers, the output watermark advancing while they fire, the end of input, the
late records' side output, and the pipeline API's checks."""

from __future__ import annotations

import pickle

import pytest

from spark_plugin import Pipeline, PipelineError
from spark_plugin.api.timers import KeyedProcessFunction
from spark_plugin.api.watermarks import MAX_WATERMARK, WatermarkStrategy
from spark_plugin.api.windows import EventTimeSessionWindows, TumblingEventTimeWindows
from spark_plugin.connectors import CollectSink, SequenceSource
from spark_plugin.connectors.event_sequence import EventSequenceSource
from spark_plugin.network.barrier import CheckpointBarrier
from spark_plugin.network.channel_items import END, Buffer, PriorityBarrier
from spark_plugin.network.config import NetworkConfig
from spark_plugin.network.elements import IDLE, Watermark, is_marker
from spark_plugin.network.framing import decode_records, encode_records
from spark_plugin.network.output_items import OutBuffer, OutEnd
from spark_plugin.plan.topology import subtask_specs
from spark_plugin.task.life import build_subtask
from tests.spark_plugin.fakes import InMemoryCoordinator

BURST = 1000
BARRIER = CheckpointBarrier(1, trigger_timestamp=0, policy="unaligned", unaligned=True)
ON_FIRING: dict[int, object] = {}


def ts(r):
    return r[1]


class TimerPerRecord(KeyedProcessFunction):
    """Registers an event-time timer at each record's timestamp; a timer emits ``(key, timestamp)``."""

    def __init__(self) -> None:
        self.fired = 0

    def process(self, key, record, ctx):
        ctx.register_event_time_timer(ctx.timestamp)

    def on_timer(self, key, timestamp, ctx):
        self.fired += 1
        hook = ON_FIRING.pop(self.fired, None)
        if hook is not None:
            hook()
        return [(key, timestamp)]


def build(vertex: str, p: Pipeline, coord: InMemoryCoordinator, **net):
    plan = p.plan()
    spec = next(s for s in subtask_specs(plan) if s.vertex == vertex)
    network = NetworkConfig(buffer_size=net.get("buffer_size", 4096), max_buffers_per_output_channel=10_000)
    st = build_subtask(plan, spec, coord.reporter(spec), None, network)
    for ch in st.partition.channels:  # no receiver is attached: credit as if one had granted plenty, so that
        ch.credit = 10_000  # output is never what stops the loop here
    return st


def timers_pipeline() -> Pipeline:
    p = Pipeline("timers")
    (
        p.source(SequenceSource(count=1), id="src", watermarks=WatermarkStrategy.for_monotonous_timestamps(ts))
        .key_by(lambda r: r[0])
        .process(TimerPerRecord(), id="timers")
        .rebalance()
        .map(lambda r: r, id="m")
        .sink(CollectSink(), id="out")
    )
    return p


def queued(st) -> list:
    """Everything the subtask sent on its first output channel (no receiver attached: it all stays queued)."""
    st.partition.flush()
    return [e for item in st.partition.channels[0].queue if type(item) is OutBuffer for e in decode_records(item.data)]


def feed_burst(st, watermark: int = BURST) -> None:
    """One buffer: a record per key at timestamps 0..BURST-1 (a timer each), then a watermark that makes all due."""
    records = [(f"key-{i}", i) for i in range(BURST)]
    st.gate.channels[0].items.append(Buffer(encode_records(records + [Watermark(watermark)])))


def test_a_priority_barrier_is_acted_on_between_two_timer_firings_of_a_burst():
    coord = InMemoryCoordinator()
    st = build("timers", timers_pipeline(), coord)
    fn = st.chain.head.fn
    feed_burst(st)
    assert st._take_input()
    st._process_current()  # the records register their timers; the watermark makes every one due: input stops
    assert st.records_in == BURST and st.event_time.busy() and fn.fired == 0

    def arrive():
        st.gate.channels[0].items.append(PriorityBarrier(BARRIER))
        st.gate.priority.append((0, BARRIER))

    ON_FIRING[5] = arrive  # the barrier arrives while the fifth timer fires
    assert st._step()
    assert fn.fired == 5  # the loop stopped firing at once
    st._handle_priority()
    state = pickle.loads(st.checkpoints.pending[1].operator_state)
    timers = state["operators"]["timers"]["timers"]
    assert sum(len(t) for t in timers["event"].values()) == BURST - 5  # the rest is checkpointed, not fired
    assert timers["watermark"] == BURST
    assert state["event_time"]["valve"]["watermark"] == BURST
    while st._step():
        pass
    assert fn.fired == BURST and not st.event_time.busy()


def test_the_output_watermark_advances_while_a_burst_of_timers_fires_and_never_passes_a_result_still_to_come():
    coord = InMemoryCoordinator()
    st = build("timers", timers_pipeline(), coord)
    feed_burst(st)
    st._take_input()
    st._process_current()
    st._handle_priority()
    while st._step():
        pass
    sent = queued(st)
    marks = [e.timestamp for e in sent if type(e) is Watermark]
    assert marks == sorted(marks) and marks[-1] == BURST
    assert len(marks) >= BURST // 256  # at least one per batch of firings, not one at the end
    watermark = None
    for e in sent:
        if type(e) is Watermark:
            watermark = e.timestamp
        else:
            assert watermark is None or e[1] > watermark, f"result {e} came after watermark {watermark}"


def test_the_end_of_input_fires_every_event_time_timer_before_the_output_ends():
    coord = InMemoryCoordinator()
    st = build("timers", timers_pipeline(), coord)
    records = [(f"k{i}", 10_000 + i) for i in range(50)]
    st.gate.channels[0].items.extend([Buffer(encode_records(records)), END])
    while st._step():
        pass
    assert st.ended_output
    sent = queued(st)
    assert sorted(r for r in sent if not is_marker(r)) == sorted(records)
    assert sent[-1] == Watermark(MAX_WATERMARK)
    assert type(st.partition.channels[0].queue[-1]) is OutEnd


def window_with_late_records() -> Pipeline:
    p = Pipeline("late")
    windowed = (
        p.source(SequenceSource(count=1), id="src", watermarks=WatermarkStrategy.for_monotonous_timestamps(ts))
        .key_by(lambda r: r[0])
        .window(TumblingEventTimeWindows.of(100))
        .aggregate(lambda: 0, lambda n, r: n + 1, id="count")
    )
    windowed.sink(CollectSink(), id="out")
    windowed.late_records().sink(CollectSink(), id="late")
    return p


def test_late_records_go_only_to_the_side_output_and_results_only_to_the_main_output():
    p = window_with_late_records()
    plan = p.plan()
    assert [v.id for v in plan.vertices] == ["src", "count", "out", "late-records-1"]
    assert [(e.target, e.side) for e in plan.vertex("count").outputs] == [("out", None), ("late-records-1", "count.late")]
    coord = InMemoryCoordinator()
    st = build("count", p, coord)
    ch = st.gate.channels[0]
    ch.items.append(Buffer(encode_records([("a", 10), ("a", 50), Watermark(150), ("a", 20), ("a", 120)])))
    ch.items.append(END)
    while st._step():
        pass
    main, side = st.partition.channels
    results = [e for item in main.queue if type(item) is OutBuffer for e in decode_records(item.data)]
    late = [e for item in side.queue if type(item) is OutBuffer for e in decode_records(item.data)]
    assert [r for r in results if not is_marker(r)] == [("a", 0, 100, 2), ("a", 100, 200, 1)]
    assert [r for r in late if not is_marker(r)] == [("a", 20)]
    assert Watermark(MAX_WATERMARK) in late  # the side output carries event time too


def test_an_idle_input_makes_the_subtask_idle_once_its_timers_fired():
    coord = InMemoryCoordinator()
    st = build("timers", timers_pipeline(), coord)
    records = [(f"k{i}", i) for i in range(300)]
    st.gate.channels[0].items.append(Buffer(encode_records(records + [Watermark(100), IDLE])))
    st._take_input()
    st._process_current()
    assert st.event_time.busy() and not st.watermark_idle
    while st._step():
        pass
    sent = queued(st)
    assert sent[-1] == IDLE and st.watermark_idle
    assert st.watermark == st.output_watermark == 100  # the highest watermark of its (idle) inputs
    assert st.chain.head.fn.fired == 101  # every timer up to it fired before IDLE went out; the rest waits


def test_a_pipeline_without_event_time_sends_no_markers_and_checkpoints_no_event_time_state():
    p = Pipeline("plain")
    p.source(SequenceSource(count=1), id="src").rebalance().map(str, id="m").sink(CollectSink(), id="out")
    coord = InMemoryCoordinator()
    st = build("m", p, coord)
    st.gate.channels[0].items.extend([Buffer(encode_records(range(10))), END])
    while st._step():
        pass
    assert st.event_time.snapshot() is None and st.watermark is None and st.output_watermark is None
    assert st.chain.snapshot(1) is not None and "event_time" not in pickle.loads(st.chain.snapshot(1))


def test_event_time_definition_errors_name_the_operator_and_the_fix():
    p = Pipeline("errors")
    no_watermarks = p.source(SequenceSource(count=1), id="plain").key_by(lambda r: r[0])
    with pytest.raises(PipelineError, match="has no watermarks"):
        no_watermarks.window(TumblingEventTimeWindows.of(10))
    events = p.source(EventSequenceSource(count=1), id="events",
                      watermarks=WatermarkStrategy.for_monotonous_timestamps(ts))
    with pytest.raises(PipelineError, match="timestamp=lambda"):
        events.map(lambda r: r, id="parse").key_by(lambda r: r[0]).window(TumblingEventTimeWindows.of(10)).reduce(max)
    with pytest.raises(PipelineError, match="need merge="):
        events.key_by(lambda r: r[0]).window(EventTimeSessionWindows.with_gap(10)).aggregate(int, max)
    with pytest.raises(PipelineError, match="late_records"):
        events.filter(bool, id="f").late_records()
    with pytest.raises(PipelineError, match="WatermarkStrategy"):
        p.source(SequenceSource(count=1), id="bad", watermarks=200)
    ok = events.filter(bool, id="kept").key_by(lambda r: r[0]).window(TumblingEventTimeWindows.of(10))
    assert ok.reduce(max, id="w").node.op.timestamp_fn is ts  # only filters: the source's timestamp still holds


class Reminder(KeyedProcessFunction):
    """A processing-time timer per record, already due; and an event-time timer that the next watermark deletes."""

    def process(self, key, record, ctx):
        ctx.register_processing_time_timer(ctx.processing_time() - 1)
        ctx.register_event_time_timer(record[1])
        if record[1] % 2:
            ctx.delete_event_time_timer(record[1])
        return None

    def on_timer(self, key, timestamp, ctx):
        return [(ctx.time_domain, key)]


def test_processing_time_timers_fire_from_the_loop_and_deleted_timers_never():
    p = Pipeline("reminders")
    (
        p.source(SequenceSource(count=1), id="src", watermarks=WatermarkStrategy.for_monotonous_timestamps(ts))
        .key_by(lambda r: r[0])
        .process(Reminder(), id="timers")
        .rebalance()
        .map(lambda r: r, id="m")
        .sink(CollectSink(), id="out")
    )
    st = build("timers", p, InMemoryCoordinator())
    records = [(f"k{i}", i) for i in range(10)]
    st.gate.channels[0].items.append(Buffer(encode_records(records + [Watermark(100)])))
    st._take_input()
    st._process_current()
    st._on_timers()
    while st._step():
        pass
    fired = [r for r in queued(st) if not is_marker(r)]
    assert sorted(k for d, k in fired if d == "processing") == sorted(k for k, _ in records)
    assert sorted(k for d, k in fired if d == "event") == [f"k{i}" for i in range(0, 10, 2)]
