"""How a source subtask reads its source from the subtask loop, and how it ends: at once, or, when a sink of the
pipeline commits on checkpoints, only after a final checkpoint whose barrier follows its last record completed."""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum
from typing import Any

from spark_plugin.connectors.base import Source
from spark_plugin.network.barrier import CheckpointBarrier

BATCH = 32
"""Records a source emits per loop turn: triggers wait at most this many records."""

REQUEST_EVERY = 1.0
"""Seconds between two requests for a final checkpoint while none is under way."""


class Read(Enum):
    RECORDS = "records"
    """Records were read (or the source just ended and asked for its final checkpoint)."""
    NOTHING = "nothing"
    """No record is ready now."""
    END = "end"
    """The source ended and the subtask's output ends now."""


class SourceReader:
    """Reads a source without blocking the loop; owns the source's end and its final checkpoint."""

    def __init__(self, source: Source, final_checkpoint: bool, request_checkpoint: Callable[[], None]) -> None:
        self.source = source
        self.final_checkpoint = final_checkpoint
        self.request_checkpoint = request_checkpoint
        self.exhausted = False
        self.ended = False
        self.final_candidates: set[int] = set()
        self.wait: float | None = None
        """Seconds until the source may have records again (from its hint), while it has none."""
        self._next_request = 0.0
        self.paused = False

    def pause(self) -> None:
        """The subtask's output has no room: the source is not polled until the next :meth:`read`, and is told
        so (a source that fetches ahead stops fetching)."""
        if not self.paused and not (self.exhausted or self.ended):
            self.paused = True
            self.source.pause()

    def read(self, process: Callable[[Any], None]) -> tuple[Read, int]:
        """Read one batch into ``process``; returns what happened and how many records were read."""
        if self.exhausted or self.ended:
            return Read.NOTHING, 0
        if self.paused:
            self.paused = False
            self.source.resume()
        batch = self.source.poll(BATCH)
        if batch is None:
            if not self.final_checkpoint:
                self.ended = True
                return Read.END, 0
            # end only after a checkpoint taken behind the last record completed (committing sinks)
            self.exhausted = True
            self._request()
            return Read.RECORDS, 0
        if not batch:
            self.wait = self.source.wait_hint()
            return Read.NOTHING, 0
        self.wait = None
        for r in batch:
            process(r)
        return Read.RECORDS, len(batch)

    def _request(self) -> None:
        self._next_request = time.monotonic() + REQUEST_EVERY
        self.request_checkpoint()

    def barrier_for(self, barrier: CheckpointBarrier) -> CheckpointBarrier:
        """The barrier to send for a trigger: once the source has nothing more, a checkpoint is a final one and its
        barrier goes aligned, behind every record, so the sinks' snapshots hold all of them."""
        if not self.exhausted or self.ended:
            return barrier
        self.final_candidates.add(barrier.checkpoint_id)
        return barrier.as_aligned_final()

    def completed(self, checkpoint_id: int) -> bool:
        """Whether the completed checkpoint was a final one: the output ends now."""
        if checkpoint_id in self.final_candidates:
            self.ended = True
            return True
        return False

    def aborted(self, checkpoint_id: int) -> None:
        self.final_candidates.discard(checkpoint_id)

    def on_timer(self) -> None:
        if self.exhausted and not self.ended and not self.final_candidates and time.monotonic() >= self._next_request:
            self._request()

    def next_wakeup(self) -> float | None:
        """Seconds until the reader must look again even if nothing signals the loop."""
        if self.exhausted and not self.ended:
            return self._next_request - time.monotonic()
        return self.wait
