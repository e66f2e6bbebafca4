"""A subtask's event time: the watermarks it takes in (its source's generator, or the valve over its input
channels), the timers of its keyed operator, and the watermark and status it sends on.

The subtask loop hands it every watermark and status marker it finds among the records of a buffer; when event
time advances past a timer, the loop stops taking input and fires the due timers from its one loop, one at a time,
acting on a priority barrier or a coordinator event between two firings (Flink's interruptible timers, FLIP-443).
Input waits until every due timer fired, because what follows the watermark in a channel must see its effects.

While timers fire, the output watermark advances with them: it is the watermark minus what is still due (just
below the earliest timer not fired yet), so downstream event time never waits for a whole burst, and never passes
a result still to come. The event-time state (each input channel's watermark and status, the output watermark, the
source's partitions) is part of every checkpoint; see ``docs/recovery.md`` for what a restore does with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spark_plugin.api.timers import TimedOperator, now_ms
from spark_plugin.api.watermarks import MAX_WATERMARK, MIN_WATERMARK, PartitionWatermarks, checked_timestamp
from spark_plugin.network.elements import ACTIVE, IDLE, Watermark
from spark_plugin.network.partition import OutputPartition
from spark_plugin.plan.topology import SubtaskSpec
from spark_plugin.task.chain import OperatorChain
from spark_plugin.task.watermarks import WatermarkValve

FIRE_BATCH = 256
"""Timers fired in one turn of the loop at most (fewer when a barrier, an event or backpressure interrupts)."""

IDLE_CHECK_MS = 200
"""How often a source whose watermarks go out after every record looks for idle partitions."""


class EventTime:
    """One subtask's watermarks, timers and output watermark."""

    def __init__(self, spec: SubtaskSpec, chain: OperatorChain, partition: OutputPartition) -> None:
        self.spec = spec
        self.chain = chain
        self.partition = partition
        self.now = now_ms()
        self.valve = WatermarkValve([c.info for c in spec.inputs])
        self.strategy = getattr(chain.head, "watermarks", None) if chain.source is not None else None
        self.generator = (
            PartitionWatermarks(self.strategy, chain.source.partitions(), self.now)  # type: ignore[union-attr]
            if self.strategy is not None else None
        )
        self.timed: TimedOperator | None = chain.head if isinstance(chain.head, TimedOperator) else None
        self.source_watermark = MIN_WATERMARK
        """A source's watermark as its generator last computed it."""
        self.output = MIN_WATERMARK
        """The last watermark sent on."""
        self.output_idle = False
        self.active = self.generator is not None or self.timed is not None
        """Event time is in use here (a generator, timers, or a marker arrived): only then are watermarks sent on
        and checkpointed, so pipelines without event time carry no markers at all."""
        self.rescaled = False
        """Restored with other channels than the checkpoint had: markers in recovered input are not in place."""
        self.ended = False
        self.fired = 0
        self._next_tick = self.now
        self._polled = False

    # ------------------------------------------------------------------ what the subtask and the UI read

    @property
    def watermark(self) -> int | None:
        """The subtask's input watermark (epoch ms; None before the first one)."""
        wm = self.source_watermark if self.generator is not None else self.valve.watermark
        return None if wm == MIN_WATERMARK else wm

    @property
    def output_watermark(self) -> int | None:
        return None if self.output == MIN_WATERMARK else self.output

    def shown(self) -> tuple[int | None, bool]:
        """What the live metrics show: the watermark a source emits, or the input watermark of any other subtask
        (the minimum over its active input channels); and whether the subtask is idle."""
        return (self.output_watermark if self.generator is not None else self.watermark), self.output_idle

    # ------------------------------------------------------------------ life

    def start(self) -> None:
        """Before the loop: load what a restore brought, send the restored output watermark on (behind the recovered
        output), and make the timers due that the checkpoint had left to fire."""
        if self.generator is not None:
            self.generator.track(self.chain.source.partitions())  # type: ignore[union-attr]  # as restored
        sections = self.chain.restored_event_time
        if sections:
            self._restore(sections)
        if self.timed is not None:
            self.timed.timers.restored(self.valve.watermark)
        if self.output > MIN_WATERMARK:
            self.partition.broadcast_element(Watermark(self.output))
        if self.output_idle:
            self.partition.broadcast_element(IDLE)

    def _restore(self, sections: list[dict[str, Any]]) -> None:
        me = (self.spec.vertex, self.spec.subtask_index, self.spec.parallelism)
        names = {c.name for c in self.valve.channels}
        first = sections[0]
        if len(sections) == 1 and tuple(first["subtask"]) == me and set(first["valve"]["channels"]) == names:
            self.valve.restore_exact(first["valve"])
            self.output, self.output_idle = first["output"], first["output_idle"]
        else:
            self.valve.restore_rescaled([s["valve"] for s in sections])
            self.output = min(s["output"] for s in sections)
            self.rescaled = True
        if self.generator is not None:
            self.generator.restore([s["source"] for s in sections if s.get("source")], self.now)
            self.generator.finished(self.chain.source.finished_partitions())  # type: ignore[union-attr]
            self.source_watermark = max(self.output, self.generator.current())
        self.active = True

    def snapshot(self) -> dict[str, Any] | None:
        """The event-time state for a checkpoint (None when event time is not in use here)."""
        if not self.active:
            return None
        return {
            "subtask": (self.spec.vertex, self.spec.subtask_index, self.spec.parallelism),
            "valve": self.valve.snapshot(),
            "output": self.output,
            "output_idle": self.output_idle,
            "source": self.generator.snapshot() if self.generator is not None else None,
        }

    # ------------------------------------------------------------------ input

    def on_marker(self, channel: int, element: Any, recovered: bool) -> bool:
        """A watermark or status marker came out of ``channel``'s buffer; True when timers are due now (the loop
        fires them before it takes the next record)."""
        if recovered and self.rescaled:
            return False  # in-flight data merged from several old channels: its markers are not in place
        self.active = True
        if type(element) is Watermark:
            advanced = self.valve.on_watermark(channel, element.timestamp)
        else:
            advanced, _ = self.valve.on_status(channel, element.idle)
        if advanced is not None:
            self._input_advanced(advanced)
        self._update_status()
        return self.busy()

    def channel_ended(self, channel: int) -> None:
        advanced, _ = self.valve.on_end(channel)
        if advanced is not None:
            self._input_advanced(advanced)
        self._update_status()

    def end_of_input(self) -> None:
        """The input ended (every channel, or the source): event time ends, every event-time timer is due."""
        if self.ended:
            return
        self.ended = True
        if self.generator is not None:
            self.source_watermark = MAX_WATERMARK
            self._update_status()
            self._advance_output()
            return
        if not self.active:
            return  # no event time here: nothing to end
        self.valve.watermark = MAX_WATERMARK
        self._input_advanced(MAX_WATERMARK)

    def _input_advanced(self, watermark: int) -> None:
        if self.timed is not None:
            self.timed.advance_watermark(watermark)
        self._advance_output()

    def wrap_source(self, process: Callable[[Any], None]) -> Callable[[Any], None]:
        """The function a source subtask hands its records to: the generator sees each record first."""
        gen = self.generator
        if gen is None:
            return process
        source = self.chain.source
        assert source is not None
        ts_of = checked_timestamp(self.strategy.timestamp, f"source {self.chain.head.id!r}")  # type: ignore[union-attr]
        part_of = source.partition_of if source.partitions() else (lambda r: None)
        per_record = self.strategy.interval == 0  # type: ignore[union-attr]

        def source_process(record: Any) -> None:
            if getattr(record, "num_rows", None) == 0:  # an empty batch has no event time, and sends no sign of life
                process(record)
                return
            if gen.on_record(ts_of(record), part_of(record), self.now) and self.output_idle:
                self._update_status()  # a partition woke up: ACTIVE goes out before its record
            process(record)
            if per_record:
                self._source_advanced()

        return source_process

    def source_polled(self, exhausted: bool) -> None:
        """The subtask asked its source for records (it had room for them); an exhausted source's event time ends,
        so the final checkpoint's barrier follows the end of event time."""
        self._polled = True
        if exhausted:
            self.end_of_input()

    def _source_advanced(self) -> None:
        assert self.generator is not None
        wm = self.generator.current()
        if wm > self.source_watermark:
            self.source_watermark = wm
            self._advance_output()

    # ------------------------------------------------------------------ output

    def _advance_output(self) -> None:
        """Send the watermark on as far as it may go: for timers, just below the earliest one still due."""
        if self.timed is not None:
            timers = self.timed.timers
            target = timers.watermark
            first = timers.next_event_time()
            if first is not None and first <= target:
                target = first - 1
        elif self.generator is not None:
            target = self.source_watermark
        else:
            target = self.valve.watermark
        if target > self.output:
            self.output = target
            self.partition.broadcast_element(Watermark(target))

    def _update_status(self) -> None:
        if self.generator is not None:
            idle = self.generator.idle and not self.ended
        elif self.valve.channels:
            idle = self.valve.idle and not self.busy()  # idle only once the timers its last watermark made due fired
        else:
            return
        if idle != self.output_idle:
            self.output_idle = idle
            self.partition.broadcast_element(IDLE if idle else ACTIVE)

    # ------------------------------------------------------------------ timers

    def busy(self) -> bool:
        """Timers are due: they fire before the subtask takes more input."""
        return self.timed is not None and self.timed.timers.has_due(self.now)

    def fire(self, interrupted: Callable[[], bool]) -> int:
        """Fire due timers, one at a time, until none is due, ``interrupted()`` (a priority barrier or an event
        waits), the output has no room, or ``FIRE_BATCH`` fired; then send the output watermark as far as it may
        go. Returns how many fired."""
        assert self.timed is not None
        op, timers, room = self.timed, self.timed.timers, self.partition.available
        now = self.now = now_ms()
        n = 0
        while n < FIRE_BATCH:
            timer = timers.pop_due(now)
            if timer is None:
                break
            op.on_timer(*timer)
            n += 1
            if interrupted() or not room():
                break
        if n:
            op.timers_fired()  # what the round gathered goes out before the barrier, record or watermark after it
        self.fired += n
        self._advance_output()
        self._update_status()
        return n

    def on_timer(self, now: int) -> None:
        """The loop's clock: a source's periodic watermark and idleness check."""
        self.now = now
        gen = self.generator
        if gen is not None and not self.ended and now >= self._next_tick:
            interval = self.strategy.interval or IDLE_CHECK_MS  # type: ignore[union-attr]
            self._next_tick = now + interval
            # a source held back by its output (backpressure) was not asked for records: none of its partitions
            # is idle for it, so their idle clocks stop meanwhile
            gen.track(self.chain.source.partitions())  # type: ignore[union-attr]  # splits discovered meanwhile
            gen.finished(self.chain.source.finished_partitions())  # type: ignore[union-attr]
            gen.tick(now, asked=self._polled)
            self._polled = False
            self._source_advanced()  # before IDLE: a watermark after it would make the receiver count us active
            self._update_status()

    def next_wakeup_ms(self) -> int | None:
        """Epoch ms at which the loop must look again: the next periodic watermark or processing-time timer."""
        times = []
        if self.generator is not None and not self.ended:
            times.append(self._next_tick)
        if self.timed is not None:
            t = self.timed.timers.next_processing_time()
            if t is not None:
                times.append(t)
        return min(times) if times else None
