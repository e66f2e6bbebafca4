"""The subtask: one loop that takes the next action (priority barrier, coordinator event, timer, record) in turn.

The loop never blocks on a full output: it stops taking input while an output channel has no room and waits on
the mailbox, which every network thread and the coordinator's event thread signal, so a priority barrier, a
trigger or a timer is acted on at once, and between two records when a buffer is in hand. The subtask is also
the :class:`~spark_plugin.barriers.BarrierActions` of its barrier handler.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from spark_plugin.barriers import BarrierHandler
from spark_plugin.checkpointing import CheckpointActions, PendingCheckpoint
from spark_plugin.config import NetworkConfig
from spark_plugin.coordination import AckWorker, CheckpointReporter, CoordinatorEvents
from spark_plugin.framing import BufferReader
from spark_plugin.keygroups import key_group_range
from spark_plugin.network import input as net_input
from spark_plugin.network.input import InputGate
from spark_plugin.network.mailbox import Mailbox
from spark_plugin.network.output import OutputChannel
from spark_plugin.operators import Operator, SourceOperator
from spark_plugin.record_writer import RecordWriter, fan_out
from spark_plugin.subtask_events import CoordinatorEventHandling
from spark_plugin.topology import TaskSpec

log = logging.getLogger("overtake.subtask")

SOURCE_BATCH = 32
"""Records a source emits per loop turn: triggers wait at most this many records."""

CHECK_EVERY = 64
"""Records between two looks at the clock while a buffer is in hand."""


class SubtaskFailed(RuntimeError):
    """The subtask cannot go on (a peer's connection broke while the pipeline was running)."""


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
    records_in: int = 0
    bytes_in: int = 0
    bytes_out: int = 0


class Subtask(CheckpointActions, CoordinatorEventHandling):
    """One subtask of a chain of operators, with its input gate, output channels and barrier handler."""

    def __init__(
        self,
        spec: TaskSpec,
        operators: list[Operator],
        edge_keys: list,
        reporter: CheckpointReporter,
        events: CoordinatorEvents | None = None,
        network: NetworkConfig | None = None,
        attempt: int | None = None,
        deadline: float | None = None,
        stop_after_checkpoints: int | None = None,
        final_checkpoint: bool = False,
    ) -> None:
        self.spec = spec
        self.final_checkpoint = final_checkpoint
        self.source_exhausted = False
        self._final_candidates: set[int] = set()
        self._next_final_request = 0.0
        self.stop_after_checkpoints = stop_after_checkpoints
        self.completed_seen = 0
        self.operators = operators
        self.network = network or NetworkConfig()
        self.attempt = attempt
        self.deadline = deadline
        self.mailbox = Mailbox()
        self.lock = self.mailbox.lock
        self.events = events
        self.ack_worker = AckWorker(reporter)
        self.gate = InputGate(
            [c.info for c in spec.inputs],
            self.network.exclusive_buffers_per_channel,
            self.network.floating_buffers_per_gate,
            self.mailbox,
        )
        self.outputs: list[OutputChannel] = []
        self.writers: list[RecordWriter] = []
        self.output_by_key: dict[str, OutputChannel] = {}
        for out, key_fn in zip(spec.outputs, edge_keys, strict=True):
            chans = []
            for info, key in zip(out.channels, out.keys, strict=True):
                ch = OutputChannel(
                    len(self.outputs), info, self.network.max_buffers_per_output_channel, self.mailbox,
                    self._on_barrier_sent,
                )
                self.outputs.append(ch)
                self.output_by_key[key] = ch
                chans.append(ch)
            self.writers.append(
                RecordWriter(
                    chans, out.edge.partitioning, key_fn, out.target_max_parallelism, self.network.buffer_size,
                    self.mailbox, start=spec.subtask_index,
                )
            )
        self.source: Any = operators[0].source if isinstance(operators[0], SourceOperator) else None
        for op in operators:
            op.open(spec.subtask_index, spec.parallelism, spec.max_parallelism)
        emit = fan_out(self.writers)
        for op in reversed(operators):
            emit = op.bind(emit)
        self.process = emit
        self.handler = BarrierHandler(len(spec.inputs), self)
        self.pending: dict[int, PendingCheckpoint] = {}
        self.current: BufferReader | None = None
        self.current_recovered = False
        self._overtaken: dict[int, list[bytes]] = {}
        self._actions: deque[tuple[str, dict]] = deque()
        self._coordinator_aborted: set[int] = set()
        self.checkpoint_log: list[dict] = []
        self.records_in = 0
        self.bytes_in = 0
        self.ended_output = False
        self.halted: str | None = None
        self._next_flush = time.monotonic() + self.network.flush_interval
        self._source_wait: float | None = None
        self._event_thread: threading.Thread | None = None
        self.restore_stats: Any = None
        self.keyed_range = (
            key_group_range(spec.subtask_index, spec.max_parallelism, spec.parallelism)
            if any(op.keyed for op in operators)
            else None
        )

    # ================================================================================== timers

    def _on_timers(self) -> None:
        now = self.now_ms()
        if (
            self.source_exhausted and not self.ended_output and not self._final_candidates
            and time.monotonic() >= self._next_final_request
        ):
            self._request_final_checkpoint()
        d = self.handler.deadline()
        if d is not None and now >= d:
            self.handler.on_timer(now)
        for cid, p in list(self.pending.items()):
            dl = p.barrier.deadline
            if not p.converted and dl is not None and now >= dl and p.out_pending > 0:
                self._convert_output_barriers(cid)
        if self.gate.next_deadline is not None and now >= self.gate.next_deadline:
            with self.lock:
                self.gate.convert_due(now)
        mono = time.monotonic()
        if mono >= self._next_flush:
            for w in self.writers:
                w.flush_all()
            self._next_flush = mono + self.network.flush_interval

    def _next_wakeup(self) -> float:
        """Seconds until the loop must look again even if nothing signals it."""
        now = time.time()
        t = self._next_flush - time.monotonic()
        d = self.handler.deadline()
        if d is not None:
            t = min(t, d / 1000 - now)
        for p in self.pending.values():
            dl = p.barrier.deadline
            if not p.converted and dl is not None:
                t = min(t, dl / 1000 - now)
        if self.gate.next_deadline is not None:
            t = min(t, self.gate.next_deadline / 1000 - now)
        if self._source_wait is not None:
            t = min(t, self._source_wait)
        if self.source_exhausted and not self.ended_output:
            t = min(t, self._next_final_request - time.monotonic())
        if self.deadline is not None:
            t = min(t, self.deadline - now)
        return max(t, 0.0005)

    # ================================================================================== the loop

    def _outputs_available(self) -> bool:
        for ch in self.outputs:
            if ch.buffers >= ch.max_buffers:
                return False
        return True

    def _handle_priority(self) -> None:
        while self.gate.priority:
            with self.lock:
                taken = self.gate.take_priority()
            if taken is None:
                return
            index, barrier, overtaken = taken
            self._overtaken[index] = overtaken
            try:
                self.handler.on_barrier(index, barrier)
            finally:
                self._overtaken.pop(index, None)

    def _process_current(self) -> None:
        reader = self.current
        assert reader is not None
        process = self.process
        priority = self.gate.priority
        actions = self._actions
        outputs = self.outputs
        n = 0
        while reader.pos < len(reader.data):
            process(reader.next())
            n += 1
            if priority or actions:
                break
            if outputs and not self._outputs_available():
                break
            if n % CHECK_EVERY == 0 and time.monotonic() >= self._next_flush:
                break
        self.records_in += n
        if reader.pos >= len(reader.data):
            self.current = None
            if not self.current_recovered:
                with self.lock:
                    self.gate.release(reader.channel)

    def _poll_source(self) -> bool:
        if self.source_exhausted:
            return False
        batch = self.source.poll(SOURCE_BATCH)
        if batch is None:
            if self.final_checkpoint:
                # end only after a checkpoint taken behind the last record completed (committing sinks)
                self.source_exhausted = True
                self._request_final_checkpoint()
            else:
                self._end_output()
            return True
        if not batch:
            self._source_wait = self.source.wait_hint()
            return False
        self._source_wait = None
        process = self.process
        for r in batch:
            process(r)
        self.records_in += len(batch)
        return True

    def _take_input(self, events_only: bool = False) -> bool:
        with self.lock:
            got = self.gate.poll(events_only)
        if got is None:
            return False
        ch, item = got
        kind = item[0]
        if kind == net_input.BUFFER or kind == net_input.RECOVERED:
            data = item[1]
            self.bytes_in += len(data)
            if ch.recording is not None:
                p = self.pending.get(ch.recording)
                if p is not None:
                    p.writer.add_input_data(ch.info, data)
            self.current = BufferReader(data, ch.index)
            self.current_recovered = kind == net_input.RECOVERED
        elif kind == net_input.BARRIER:
            self.handler.on_barrier(ch.index, item[1])
        elif kind == net_input.END:
            ch.ended = True
            self.handler.on_channel_ended(ch.index)
            if self.gate.all_ended():
                self._end_output()
        return True

    def _step(self) -> bool:
        """Do one piece of work; False when there is nothing to do now."""
        if self.ended_output:
            return False
        if self.outputs and not self._outputs_available():
            # no room for records, but a barrier or the end of a channel can still be taken
            return self.current is None and self.source is None and self._take_input(events_only=True)
        if self.current is not None:
            self._process_current()
            return True
        if self.source is not None:
            return self._poll_source()
        return self._take_input()

    def _end_output(self) -> None:
        if self.ended_output:
            return
        for w in self.writers:
            w.flush_all()
        with self.lock:
            for ch in self.outputs:
                ch.end()
        self.ended_output = True

    def _finished(self) -> bool:
        if not self.ended_output:
            return False
        with self.lock:
            drained = all(ch.finished or ch.closed for ch in self.outputs)
        return drained and not any(not p.writer.done for p in self.pending.values() if not p.writer.aborted)

    def _check_failures(self) -> None:
        failed = self.gate.failed()
        if failed is not None:
            raise SubtaskFailed(f"input channel {failed.info.name} broke: {failed.error}")
        for ch in self.outputs:
            if ch.error is not None:
                raise SubtaskFailed(f"output channel {ch.info.name} broke: {ch.error}")

    def rewind(self, job_id: int, checkpoint_id: int | None) -> None:
        """An attempt of ``job_id`` starts from ``checkpoint_id``: before ``restore``, before the loop (sinks
        withdraw output of later checkpoints that they committed, since this attempt produces it again)."""
        for op in self.operators:
            op.rewind(job_id, checkpoint_id)

    def run(self) -> SubtaskResult:
        """Run until the input ends, the job is cancelled, or the deadline passes."""
        self.start_events()
        status = "finished"
        while True:
            if self.deadline is not None and time.time() >= self.deadline:
                status = "time limit"
                break
            if self.halted:
                status = self.halted
                break
            self._run_actions()
            self._handle_priority()
            self._on_timers()
            self._complete_checkpoints()
            if self._finished():
                break
            self._check_failures()
            if not self._step():
                for w in self.writers:
                    w.flush_all()
                with self.lock:
                    if not (self._actions or self.gate.priority):
                        self.mailbox.wait(self._next_wakeup())
        return self._result(status)

    def _result(self, status: str) -> SubtaskResult:
        """What the loop reports; the operators stay open (sinks may still commit): ``close_operators`` fills
        in their outputs."""
        return SubtaskResult(
            vertex=self.spec.vertex,
            subtask_index=self.spec.subtask_index,
            status=status,
            checkpoints=self.checkpoint_log,
            records_in=self.records_in,
            bytes_in=self.bytes_in,
            bytes_out=sum(w.bytes_out for w in self.writers),
        )

    def close_operators(self, result: SubtaskResult) -> SubtaskResult:
        """Close every operator (once the run is over and sinks committed what they could); their outputs go into
        ``result``."""
        for op in self.operators:
            out = op.close()
            if out is not None:
                result.outputs[op.id] = out
        return result

    def close(self, timeout: float = 30.0) -> None:
        """Finish reporting, then close the channels and the event stream."""
        self.ack_worker.close(timeout)
        if self.events is not None:
            self.events.close()
        self.gate.close()
        for ch in self.outputs:
            ch.close()
