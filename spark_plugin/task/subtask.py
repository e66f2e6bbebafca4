"""The subtask: its parts (operator chain, input gate, output partition, barrier handler, checkpoint controller,
source reader, coordinator events and the reactions to them) and the one loop that takes the next action in turn: a
priority barrier, a coordinator event, a timer, then a record.

The loop never blocks on a full output: it stops taking input while an output channel has no room and waits on the
mailbox, which every network thread and the event thread signal, so a priority barrier, a trigger or a timer is acted
on at once, and between two records when a buffer is in hand.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contract.keygroups import key_group_range
from spark_plugin.network.channel_items import DATA, Barrier, End, RecoveredBuffer
from spark_plugin.network.config import NetworkConfig
from spark_plugin.network.debloat import BufferDebloater
from spark_plugin.network.elements import MARKERS
from spark_plugin.network.framing import BufferReader
from spark_plugin.network.input import InputGate
from spark_plugin.network.mailbox import Mailbox
from spark_plugin.network.partition import OutputPartition
from spark_plugin.plan.topology import SubtaskSpec
from spark_plugin.task.ack_worker import AckWorker
from spark_plugin.task.barriers import BarrierHandler
from spark_plugin.task.chain import OperatorChain
from spark_plugin.task.channel_state import ChannelStateWriter
from spark_plugin.task.checkpoints import CheckpointController, now_ms
from spark_plugin.task.coordination import DEFAULT_MAX_OUTAGE, CheckpointReporter, CoordinatorEvents
from spark_plugin.task.event_reactions import EventReactions
from spark_plugin.task.event_time import EventTime
from spark_plugin.task.events import EventFeed
from spark_plugin.task.metrics import LiveMetrics
from spark_plugin.task.recovery import RecoveryProgress
from spark_plugin.task.regeneration import InputCounts, OutputLog
from spark_plugin.task.source_reader import Read, SourceReader
from spark_plugin.task.state_store import StateTargets, StateWriter

log = logging.getLogger("overtake.subtask")

CHECK_EVERY = 64
"""Records between two looks at the clock while a buffer is in hand."""


class SubtaskFailed(RuntimeError):
    """The subtask cannot go on (a peer's connection broke, the coordinator is gone, ...): the Spark task fails."""


@dataclass
class SubtaskResult:
    """What a subtask reports back to the driver when it ends."""

    vertex: str
    subtask_index: int
    status: str
    outputs: dict[str, Any] = field(default_factory=dict)
    checkpoints: list[dict] = field(default_factory=list)
    acked: list[int] = field(default_factory=list)
    declined: list[int] = field(default_factory=list)
    report_errors: list[str] = field(default_factory=list)
    acks_relayed: int = 0
    """Acks sent through the host's ack relay (the rest went directly)."""
    metrics_relayed: int = 0
    """Live metrics samples this subtask handed to its host's relay (the rest went directly, or were not taken)."""
    records_in: int = 0
    bytes_in: int = 0
    bytes_out: int = 0


class Subtask:
    """One subtask of a chain of operators."""

    def __init__(
        self,
        spec: SubtaskSpec,
        chain: OperatorChain,
        key_fns: list[Callable[[Any], Any] | None],
        reporter: CheckpointReporter,
        events: CoordinatorEvents | None = None,
        network: NetworkConfig | None = None,
        attempt: int | None = None,
        deadline: float | None = None,
        stop_after_checkpoints: int | None = None,
        final_checkpoint: bool = False,
        max_outage: float = DEFAULT_MAX_OUTAGE,
        input_key_fns: dict[str, Callable[[Any], Any]] | None = None,
        state_writer: StateWriter | None = None,
    ) -> None:
        self.spec = spec
        self.input_key_fns = input_key_fns or {}
        """The key selector of each hash edge into this subtask, by upstream vertex (to route restored records)."""
        self.chain = chain
        self.network = network or NetworkConfig()
        self.deadline = deadline
        self.mailbox = Mailbox()
        self.lock = self.mailbox.lock
        self.writer = ChannelStateWriter(self.network.channel_state_compression)
        net = self.network
        self.gate = InputGate(
            [c.info for c in spec.inputs], net.exclusive_buffers_per_channel, net.floating_buffers_per_gate,
            self.mailbox, self.writer,
            debloater=BufferDebloater(net, time.monotonic()) if net.debloating and spec.inputs else None,
        )
        self.partition = OutputPartition(spec.outputs, key_fns, net, self.mailbox, self.writer, spec.subtask_index)
        chain.open(spec.subtask_index, spec.parallelism, spec.max_parallelism)
        self.process = chain.bind(self.partition.emit)
        self.key_group_range = key_group_range(spec.subtask_index, spec.max_parallelism, spec.parallelism)
        # regenerated outputs (``spark_plugin.task.regeneration``): this subtask logs its inputs, or counts what it
        # processed of a regenerating upstream's
        if self.partition.regenerated is not None:
            chain.output_log = OutputLog(
                self.partition.regenerated, net.exclusive_buffers_per_channel + net.floating_buffers_per_gate,
                spec.subtask_index,
            )
            self.process = chain.output_log.wrap(self.process)
        self.channel_process: dict[int, Callable[[Any], None]] = {}
        """The function that processes the records of each regenerating input channel (counting them)."""
        regenerated = [(i, c) for i, c in enumerate(spec.inputs) if c.regenerated]
        if regenerated:
            chain.input_counts = InputCounts(self.input_key_fns, spec.max_parallelism, self.key_group_range)
            for i, c in regenerated:
                assert c.info.peer_vertex is not None and c.info.peer_subtask is not None
                self.channel_process[i] = chain.input_counts.wrap(self.process, c.info.peer_vertex, c.info.peer_subtask)
        chain.bind_side_outputs(self.partition.side_emits)
        # event time: watermarks in from the source or the input channels, timers, watermarks out
        self.event_time = EventTime(spec, chain, self.partition)
        chain.event_time_state = self.event_time.snapshot
        self.source_process = self.event_time.wrap_source(self.process)
        self.ending = False
        targets = StateTargets()
        self.ack_worker = AckWorker(reporter, max_outage, targets=targets, writer=state_writer)
        self.keyed_range = self.key_group_range if chain.keyed else None
        self.checkpoints = CheckpointController(
            spec.name, chain, self.gate, self.partition, self.writer, self.ack_worker,
            bytes_in=lambda: self.bytes_in, in_hand=self._in_hand, key_group_range=self.keyed_range,
            during_recovery=self.network.checkpoints_during_recovery, regenerated_inputs=set(self.channel_process),
        )
        self.checkpoints.replaying_in_hand = lambda: self.current is not None and self.current_in_recovery
        self.handler = BarrierHandler(self.checkpoints)
        self.reader = (
            SourceReader(chain.source, final_checkpoint, self.ack_worker.request_checkpoint)
            if chain.source is not None
            else None
        )
        self.reactions = EventReactions(
            self, bool(spec.inputs), self.handler, self.checkpoints, self.writer, chain, self.reader,
            stop_after_checkpoints,
        )
        self.events = EventFeed(
            events, attempt, self.mailbox, on_trigger=lambda t: self.reactions.target(targets, t),
            on_ended=chain.attempt_over,
        )
        self.current: BufferReader | None = None
        self.current_recovered = False
        self.current_in_recovery = False
        """The buffer in hand was taken while the gate still recovered (a restored one, or one sent before its
        upstream's ``RECOVERY_END``)."""
        self.records_in = 0
        self.bytes_in = 0
        self.running_reported = False
        self.ended_output = False
        self.halted: str | None = None
        self._next_flush = time.monotonic() + self.network.flush_interval
        self.restore_stats: Any = None
        self.started_at = now_ms()
        """When the subtask was built, at its task's start (ms since the epoch)."""
        self.recovery: RecoveryProgress | None = None
        """Restored from a checkpoint: its replay's progress, reported with its live metrics."""
        self.live = LiveMetrics(
            getattr(reporter, "report_metrics", None),
            watermark=self.event_time.shown,
            splits=getattr(chain.source, "split_metrics", None),
        )
        self.output_full = False
        """The last turn found no room in the outputs: a wait now is backpressure."""

    # ================================================================================== the loop

    def run(self) -> SubtaskResult:
        """Run until the input ends, the job is cancelled, or the deadline passes."""
        self.event_time.start()
        self.events.start()
        if self.recovery is not None:
            self.recovery.loop_started_at = now_ms()
            self.live.recovery = self.recovery.sample
            # at once, not a second later: the coordinator learns that the restored subtask runs, and what it replays
            self.live.tick(self.records_in, self.bytes_in, self.partition.bytes_out, force=True)
        status = "finished"
        while True:
            if self.deadline is not None and time.time() >= self.deadline:
                status = "time limit"
                break
            if self.halted:
                status = self.halted
                break
            self._take_events()
            self._handle_priority()
            self._on_timers()
            self.checkpoints.hand_over_ready()
            if not self.running_reported and not self.checkpoints.recovering():
                # started, and replayed whatever it restored unless it may take checkpoints while replaying
                self.ack_worker.report_running()
                self.running_reported = True
            if self._finished():
                break
            self._check_failures()
            if not self._step():
                self.partition.flush_sendable()
                with self.lock:
                    if not (self.events.queue or self.gate.priority):
                        waited = time.monotonic()
                        self.mailbox.wait(self._next_wakeup())
                        if self.output_full:
                            self.live.blocked(time.monotonic() - waited)
                        elif self.gate.debloater is not None:
                            self.gate.debloater.add_idle(time.monotonic() - waited)
        if self._replay_finished(now_ms()):  # the loop ended as its replay did
            self.live.tick(self.records_in, self.bytes_in, self.partition.bytes_out, force=True)
        return SubtaskResult(
            vertex=self.spec.vertex,
            subtask_index=self.spec.subtask_index,
            status=status,
            checkpoints=self.checkpoints.log,
            records_in=self.records_in,
            bytes_in=self.bytes_in,
            bytes_out=self.partition.bytes_out,
        )

    def _step(self) -> bool:
        """Do one piece of work; False when there is nothing to do now."""
        self.output_full = False
        if self.ended_output:
            return False
        if self.event_time.busy():  # due timers fire before any more input, a few at a time
            if not self.partition.available():
                self.output_full = True
                return False
            self.event_time.fire(self._interrupted)
            if self.ending and not self.event_time.busy():
                self.end_output()
            return True
        if not self.partition.available():
            self.output_full = True
            if self.reader is not None:
                self.reader.pause()
            # no room for records, but a barrier or the end of a channel can still be taken
            return self.current is None and self.reader is None and self._take_input(events_only=True)
        if self.current is not None:
            self._process_current()
            return True
        if self.reader is not None:
            return self._read_source()
        return self._take_input()

    def _read_source(self) -> bool:
        assert self.reader is not None
        read, n = self.reader.read(self.source_process)
        self.records_in += n
        self.event_time.source_polled(self.reader.exhausted)
        if read is Read.END:
            self.end_output()
        return read is not Read.NOTHING

    def _take_input(self, events_only: bool = False) -> bool:
        with self.lock:
            got = self.gate.poll(events_only)
        if got is None:
            return False
        ch, item = got
        kind = type(item)
        if kind in DATA:
            data = item.data
            self.bytes_in += len(data)
            self.current = BufferReader(data, ch.index)
            self.current_recovered = kind is RecoveredBuffer
            self.current_in_recovery = self.gate.recovering
            if self.current_recovered and self.recovery is not None:
                self.recovery.replayed_input += len(data)
        elif kind is Barrier:
            self.handler.on_barrier(ch.index, item.barrier)
        elif kind is End:
            ch.ended = True
            self.handler.on_channel_ended(ch.index)
            self.event_time.channel_ended(ch.index)
            if self.gate.all_ended():
                self.end_output()
        return True

    def _process_current(self) -> None:
        reader = self.current
        assert reader is not None
        # a regenerating channel's records are counted, unless restored (they came from the old attempt's subtasks)
        process = self.process if self.current_recovered else self.channel_process.get(reader.channel, self.process)
        priority = self.gate.priority
        events = self.events.queue
        partition = self.partition
        markers, event_time, recovered = MARKERS, self.event_time, self.current_recovered
        states = self.checkpoints.writer  # a checkpoint whose channel state became complete is handed over at once
        n = 0
        while reader.pos < len(reader.data):
            record = reader.next()
            if type(record) in markers:  # a watermark or status: event time, not a record
                if event_time.on_marker(reader.channel, record, recovered):
                    break  # timers are due: they fire before the next record
                continue
            process(record)
            n += 1
            if priority or events or states.newly_ready:
                break
            if partition.channels and not partition.available():
                break
            if n % CHECK_EVERY == 0 and time.monotonic() >= self._next_flush:
                break
        self.records_in += n
        if reader.pos >= len(reader.data):
            self.current = None
            if not self.current_recovered:
                with self.lock:
                    self.gate.release(reader.channel)

    def _in_hand(self, channel: int) -> bytes | None:
        """The unread rest of the buffer in hand, if it came from ``channel``."""
        cur = self.current
        if cur is not None and cur.channel == channel and cur.has_next():
            return cur.rest()
        return None

    def _handle_priority(self) -> None:
        while True:
            with self.lock:
                got = self.gate.next_priority()
            if got is None:
                return
            index, barrier = got
            try:
                self.handler.on_barrier(index, barrier)
            finally:
                with self.lock:
                    self.gate.priority_done(index, barrier)

    def _on_timers(self) -> None:
        now = now_ms()
        if self.reader is not None:
            self.reader.on_timer()
        self.event_time.on_timer(now)
        d = self.handler.deadline()
        if d is not None and now >= d:
            self.handler.on_timer(now)
        self.checkpoints.switch_due_output_barriers(now)
        if self.gate.next_deadline is not None and now >= self.gate.next_deadline:
            with self.lock:
                self.gate.convert_due(now)
        # the end of a replay goes out at once: the subtask may end, or its reports stop reaching the coordinator,
        # before the next interval
        self.live.tick(self.records_in, self.bytes_in, self.partition.bytes_out, force=self._replay_finished(now))
        mono = time.monotonic()
        if mono >= self._next_flush:
            self.partition.flush_sendable()
            self._next_flush = mono + self.network.flush_interval
        if self.gate.debloater is not None:
            self.gate.debloat(mono, self.current is not None and not self.current_recovered)

    def _replay_finished(self, now: int) -> bool:
        """Whether a restored subtask's replay finished just now."""
        recovery = self.recovery
        return recovery is not None and recovery.finished_at is None and recovery.check_finished(
            self.gate.recovering, self.current is not None and self.current_recovered, now
        )

    def _next_wakeup(self) -> float:
        """Seconds until the loop must look again even if nothing signals it."""
        now = time.time()
        t = self._next_flush - time.monotonic()
        if self.gate.debloater is not None:
            t = min(t, self.gate.debloater.next_at - time.monotonic())
        for deadline_ms in (self.handler.deadline(), self.checkpoints.next_deadline(), self.gate.next_deadline,
                            self.event_time.next_wakeup_ms()):
            if deadline_ms is not None:
                t = min(t, deadline_ms / 1000 - now)
        if self.reader is not None:
            wait = self.reader.next_wakeup()
            if wait is not None:
                t = min(t, wait)
        if self.deadline is not None:
            t = min(t, self.deadline - now)
        return max(t, 0.0005)

    def end_output(self) -> None:
        """The input ended (or the source's final checkpoint completed): due timers fire, then the output ends."""
        if self.ended_output:
            return
        self.ending = True
        self.event_time.end_of_input()  # event time ends with the input: every event-time timer is due
        if self.event_time.busy():
            return  # they fire first (``_step``), then the output ends
        self.partition.end()
        self.ended_output = True

    def _interrupted(self) -> bool:
        """Something must be acted on between two timer firings: a priority barrier or a coordinator event."""
        return bool(self.gate.priority or self.events.queue)

    @property
    def watermark(self) -> int | None:
        """The subtask's input watermark in epoch ms (its source's, or the minimum over its active input channels);
        None before the first one."""
        return self.event_time.watermark

    @property
    def output_watermark(self) -> int | None:
        """The last watermark the subtask sent on (epoch ms; None before the first one)."""
        return self.event_time.output_watermark

    @property
    def watermark_idle(self) -> bool:
        """Whether the subtask told its downstream it is idle (all of its inputs are)."""
        return self.event_time.output_idle

    def _finished(self) -> bool:
        return self.ended_output and self.partition.drained() and not self.checkpoints.taking()

    def _check_failures(self) -> None:
        failed = self.gate.failed()
        if failed is not None:
            raise SubtaskFailed(f"{self.spec.name}: input channel {failed.info.name} broke: {failed.error}")
        broken = self.partition.failed()
        if broken is not None:
            raise SubtaskFailed(f"{self.spec.name}: output channel {broken.info.name} broke: {broken.error}")
        for failure in (self.ack_worker.failure, self.events.failure):
            if failure is not None:
                raise SubtaskFailed(f"{self.spec.name}: {failure}")
        if self.events.ended is not None:
            self.halted = f"job ended ({self.events.ended})"

    # ================================================================================== coordinator events

    def _take_events(self) -> None:
        for payload in self.events.take():
            self.reactions.dispatch(payload)

    # ================================================================================== after the loop

    def serve_finished(self, stop: threading.Event) -> None:
        """After the loop ended: acknowledge the checkpoints triggered while other subtasks still run.

        A finished subtask receives no barriers any more, so it answers triggers with its final state (for a
        source: its final offsets) until ``stop`` is set, which happens once every subtask of the run finished.
        """
        while not stop.is_set():
            self._serve_once()

    def _serve_once(self) -> None:
        self._take_events()
        self.checkpoints.hand_over_ready()
        with self.lock:
            if not self.events.queue:
                self.mailbox.wait(0.05)

    def settle(self, status: str, timeout: float = 60.0) -> None:
        """After every subtask of the run left its loop: a run that ended because its input ended waits until its
        sinks committed all their output (the ``checkpoint.completed`` of the final checkpoint may still be on its
        way). Its sources end only after that checkpoint completed, so the event comes; if it does not within
        ``timeout`` seconds, the subtask fails, and the restart commits the output from the checkpoint instead.
        Runs that were stopped (cancelled, time limit, savepoint) leave output after their last completed
        checkpoint uncommitted, as they should."""
        if status != "finished":
            return
        deadline = time.monotonic() + timeout
        while self.chain.uncommitted():
            if time.monotonic() > deadline or self.halted:
                raise SubtaskFailed(
                    f"{self.spec.name}: its sinks still hold output of checkpoint(s) whose completion did not "
                    f"arrive within {timeout:.0f}s after the run ended"
                )
            self._serve_once()

    def close_operators(self, result: SubtaskResult) -> SubtaskResult:
        """Close every operator (once the run is over and sinks committed what they could); their outputs go into
        ``result``."""
        result.outputs.update(self.chain.close())
        return result

    def close(self, timeout: float = 30.0) -> None:
        """Finish reporting, then close the channels and the event stream, and release what the operators hold
        outside Python (a failed subtask's Kafka consumer stops here, not when the worker exits)."""
        self.live.close()
        self.ack_worker.close(timeout)
        self.events.close()
        self.gate.close()
        self.partition.close()
        self.chain.release()
