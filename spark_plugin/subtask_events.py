"""Coordinator events in the subtask loop: triggers, switch to unaligned, aborts, completions, job status.

:class:`CoordinatorEventHandling` is mixed into :class:`~spark_plugin.subtask.Subtask`. A thread reads the
job's event stream and posts events to the loop's mailbox; the loop runs them between two records.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

from spark_plugin.barriers import CheckpointBarrier

log = logging.getLogger("overtake.subtask")


class CoordinatorEventHandling:
    """Event handling of a subtask (uses its ``handler``, ``pending``, ``operators``, ``ack_worker``)."""

    def start_events(self) -> None:
        if self.events is None:
            return
        self._event_thread = threading.Thread(target=self._read_events, name="events", daemon=True)
        self._event_thread.start()

    def _read_events(self) -> None:
        assert self.events is not None
        try:
            for kind, data in self.events:
                attempt = data.get("attempt")
                if kind.startswith("checkpoint.") and attempt is not None and self.attempt is not None:
                    if attempt != self.attempt:
                        continue
                self.post(kind, data)
        except Exception as e:  # noqa: BLE001
            log.warning("event stream ended: %s", e)

    def post(self, kind: str, data: dict) -> None:
        """Hand a coordinator event to the loop (any thread)."""
        with self.lock:
            self._actions.append((kind, data))
            self.mailbox.signal_locked()

    def _run_actions(self) -> None:
        while self._actions:
            kind, data = self._actions.popleft()
            if kind == "checkpoint.triggered":
                self._on_trigger(data)
            elif kind == "checkpoint.switch_to_unaligned":
                cid = int(data["checkpoint_id"])
                self.handler.on_switch_to_unaligned(cid)
                self._convert_output_barriers(cid)
            elif kind == "checkpoint.aborted":
                cid = int(data["checkpoint_id"])
                self._coordinator_aborted.add(cid)
                self._final_candidates.discard(cid)
                reason = str(data.get("reason") or "aborted by the coordinator")
                self.handler.on_abort(cid, reason)
                if cid in self.pending:
                    self.abort(cid, reason)
            elif kind == "checkpoint.completed":
                cid = int(data["checkpoint_id"])
                for op in self.operators:
                    op.notify_checkpoint_complete(cid)
                if cid in self._final_candidates:
                    self._end_output()
                self.completed_seen += 1
                if self.stop_after_checkpoints is not None and self.completed_seen >= self.stop_after_checkpoints:
                    self.halted = "checkpoint limit"
            elif kind == "job.status":
                if data.get("status") in ("CANCELLED", "FAILED", "FINISHED"):  # FINISHED: stopped with a savepoint
                    self.halted = f"job {data.get('status', '').lower()}"

    def _on_trigger(self, data: dict) -> None:
        if self.spec.inputs and not self.ended_output:
            return  # only sources act on triggers; the others wait for barriers
        barrier = CheckpointBarrier(
            checkpoint_id=int(data["checkpoint_id"]),
            trigger_timestamp=int(data.get("trigger_timestamp") or self.now_ms()),
            policy=str(data.get("policy") or "aligned"),
            alignment_timeout=data.get("alignment_timeout"),
            is_savepoint=bool(data.get("is_savepoint", False)),
        )
        if self.source_exhausted and not self.ended_output:
            # The source has nothing more: a checkpoint whose barrier follows its last record is a final one.
            # Its barrier goes aligned, behind every record, so the sinks' snapshots hold all of them.
            self._final_candidates.add(barrier.checkpoint_id)
            barrier = dataclasses.replace(barrier, policy="aligned", alignment_timeout=None)
        if self.ended_output:
            # a finished subtask still acknowledges: its final state (and offsets), no barrier to send
            if barrier.checkpoint_id > self.handler.latest_checkpoint_id:
                self.handler.latest_checkpoint_id = barrier.checkpoint_id
                self.snapshot(barrier, False, self.now_ms())
                p = self.pending[barrier.checkpoint_id]
                p.writer.finish_input()
                p.writer.finish_output()
            return
        self.handler.on_trigger(barrier)

    def _request_final_checkpoint(self) -> None:
        self._next_final_request = time.monotonic() + 1.0
        self.ack_worker.request_checkpoint()

    def serve_finished(self, stop: threading.Event) -> None:
        """After the loop ended: acknowledge the checkpoints triggered while other subtasks still run.

        A finished subtask receives no barriers any more, so it answers triggers with its final state (for a
        source: its final offsets) until ``stop`` is set, which happens once every subtask of the run finished.
        """
        while not stop.is_set():
            self._serve_once()

    def _serve_once(self) -> None:
        self._run_actions()
        self._complete_checkpoints()
        with self.lock:
            if not self._actions:
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
        while any(op.uncommitted() for op in self.operators):
            if time.monotonic() > deadline or self.halted:
                from spark_plugin.subtask import SubtaskFailed

                raise SubtaskFailed(
                    f"{self.spec.vertex}[{self.spec.subtask_index}]: its sinks still hold output of checkpoint(s) "
                    f"whose completion did not arrive within {timeout:.0f}s after the run ended"
                )
            self._serve_once()
