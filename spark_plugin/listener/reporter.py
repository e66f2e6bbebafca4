"""The listener's background side: a bounded outbox of query events and the thread that reports them to the
coordinator in order, retrying with backoff while it is unreachable, so Spark's listener thread never waits.

Per query run it finds the query's job by label (and resumes it with a new attempt) or registers it, reports each
micro-batch as an external checkpoint, and finishes the job when the query terminates.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from client.errors import (
    Conflict,
    CoordinatorUnreachable,
    InvalidRequest,
    NotFound,
    OvertakeError,
    Unavailable,
)
from client.sync import OvertakeClient
from contract.models import TERMINAL_JOB_STATUSES, CheckpointStatus, JobStatus
from spark_plugin.listener.progress import QUERY_LABEL, checkpoint_of, failure_message, job_spec

log = logging.getLogger("overtake.listener")

# No answer (None), or answers that mean "later": retried for as long as they last. Other 5xx a few times.
_ALWAYS_RETRIED = (None, 429, 502, 503, 504)
_SERVER_ERROR_TRIES = 10


@dataclass(frozen=True)
class Started:
    query_id: str
    run_id: str
    name: str | None


@dataclass(frozen=True)
class Progress:
    query_id: str
    run_id: str
    name: str | None
    progress: dict[str, Any]


@dataclass(frozen=True)
class Terminated:
    query_id: str
    run_id: str
    name: str | None
    exception: str | None
    last_progress: dict[str, Any] | None = None


Item = Started | Progress | Terminated


@dataclass
class Stats:
    """What the listener did so far (``OvertakeListener.stats()``)."""

    reported: int = 0  # micro-batches the coordinator recorded
    duplicates: int = 0  # micro-batches it had recorded before (e.g. a batch re-run after a restart)
    rejected: int = 0  # reports it refused (an id below the job's next id, a conflicting report, a bad body)
    dropped: int = 0  # micro-batches never sent because the buffer was full
    pending: int = 0  # items waiting in the buffer, the one being sent included
    jobs: dict[str, int] = field(default_factory=dict)  # Spark query id -> coordinator job id


class Outbox:
    """Items in arrival order. At most ``capacity`` progress items wait: past that a new one is dropped and
    counted, never waited for. Start and termination items are always kept (one each per query run)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"buffer_size must be at least 1, got {capacity}")
        self.capacity = capacity
        self._items: deque[Item] = deque()
        self._progress = 0
        self._busy = False
        self._cond = threading.Condition()
        self.dropped = 0
        self._last_warning = 0.0

    def put(self, item: Item) -> bool:
        """Add an item without blocking; False when it was dropped."""
        with self._cond:
            if isinstance(item, Progress) and self._progress >= self.capacity:
                self.dropped += 1
                now = time.monotonic()
                if self.dropped == 1 or now - self._last_warning >= 10.0:
                    self._last_warning = now
                    log.warning(
                        "overtake listener: buffer of %d micro-batch reports is full (is the coordinator down?); "
                        "dropped batch %s of query %s, %d dropped so far",
                        self.capacity,
                        item.progress.get("batchId"),
                        item.query_id,
                        self.dropped,
                    )
                return False
            self._items.append(item)
            self._progress += isinstance(item, Progress)
            self._cond.notify_all()
            return True

    def next(self, stop: threading.Event) -> Item | None:
        """The oldest item (left in place until ``done``), waiting for one; None once stopped."""
        with self._cond:
            while not self._items and not stop.is_set():
                self._cond.wait(0.5)
            if stop.is_set() and not self._items:
                return None
            self._busy = True
            return self._items[0]

    def done(self) -> None:
        with self._cond:
            item = self._items.popleft()
            self._progress -= isinstance(item, Progress)
            self._busy = False
            self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._items)

    def wait_empty(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._items or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(0.2 if left is None else min(0.2, left))
            return True


@dataclass
class _Run:
    """What the reporter knows of one run of a query."""

    job_id: int | None = None
    attempt: int | None = None
    last_batch: int | None = None
    ended: bool = False


class Reporter(threading.Thread):
    """Takes items from the outbox one at a time and retries each while the coordinator is unreachable or
    answers 429/502/503/504 (another 5xx: ten times), waiting ``backoff`` doubling up to ``max_backoff`` seconds.
    Errors it cannot retry are logged and the item is passed over."""

    def __init__(
        self,
        client: OvertakeClient,
        outbox: Outbox,
        labels: dict[str, str],
        backoff: float,
        max_backoff: float,
    ) -> None:
        super().__init__(name="overtake-listener", daemon=True)
        self.client = client
        self.outbox = outbox
        self.labels = labels
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.stop_event = threading.Event()
        self.stats = Stats()
        self._runs: dict[str, _Run] = {}
        self._jobs: dict[str, int] = {}  # query id -> job id, once known
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------------- the loop

    def run(self) -> None:
        while True:
            item = self.outbox.next(self.stop_event)
            if item is None:
                return
            failures = 0
            while True:
                try:
                    self._handle(item)
                    break
                except (CoordinatorUnreachable, Unavailable) as exc:
                    if self.stop_event.is_set():
                        log.warning("overtake listener: stopped with unsent reports (%s)", exc)
                        return
                    if exc.status_code not in _ALWAYS_RETRIED and failures >= _SERVER_ERROR_TRIES:
                        # an answer that keeps failing (a 500) is not an outage: do not hold back the rest
                        log.error("overtake listener: giving up on %s: %s", _describe(item), exc)
                        self._refused(item)
                        break
                    delay = min(self.max_backoff, self.backoff * 2 ** min(failures, 30))
                    failures += 1
                    if failures == 1 or failures % 10 == 0:
                        log.warning(
                            "overtake listener: coordinator unavailable, retrying in %.1fs: %s", delay, exc
                        )
                    self.stop_event.wait(random.uniform(delay / 2, delay))
                except OvertakeError as exc:
                    log.error("overtake listener: the coordinator refused %s: %s", _describe(item), exc)
                    self._refused(item)
                    break
                except Exception:  # never let a bug here end the thread: the next items still go out
                    log.exception("overtake listener: could not report %s", _describe(item))
                    break
            self.outbox.done()

    def _handle(self, item: Item) -> None:
        run = self._runs.setdefault(item.run_id, _Run())
        if isinstance(item, Started):
            self._ensure_job(item, run, progress=None, create=False)
        elif isinstance(item, Progress):
            self._report(item, run)
        else:
            self._finish(item, run)

    # ------------------------------------------------------------------------------------------- jobs

    def _ensure_job(self, item: Item, run: _Run, progress: dict[str, Any] | None, create: bool) -> int | None:
        """The job of this run: found by the query's label and resumed with a new attempt, or registered (only
        when ``create``: the graph needs a progress). Repeating it after a lost answer finds what it created."""
        if run.job_id is not None:
            return run.job_id
        job = self._find(item.query_id)
        if job is None:
            if not create:
                return None
            try:
                job = self.client.create_job(job_spec(item.query_id, item.name, progress, self.labels))
            except InvalidRequest as exc:  # a graph the coordinator refuses must not cost the reports
                log.warning(
                    "overtake listener: query %s registered with a one-vertex graph: %s", item.query_id, exc
                )
                job = self.client.create_job(job_spec(item.query_id, item.name, None, self.labels))
            log.info("overtake listener: query %s registered as job %d", item.query_id, job.id)
        attempt = self.client.start_attempt(job.id, restore_from="latest")
        if attempt.attempt > 1:
            log.info(
                "overtake listener: query %s continues job %d (attempt %d, after checkpoint %s)",
                item.query_id,
                job.id,
                attempt.attempt,
                attempt.restore_plan.checkpoint_id,
            )
        run.job_id, run.attempt = job.id, attempt.attempt
        with self._lock:
            self._jobs[item.query_id] = job.id
        return job.id

    def _find(self, query_id: str):
        page = self.client.list_jobs(label=f"{QUERY_LABEL}={query_id}", limit=100)
        usable = [j for j in page.items if j.status != JobStatus.cancelled]
        return max(usable, key=lambda j: j.id) if usable else None

    # ------------------------------------------------------------------------------------------- batches

    def _report(self, item: Progress, run: _Run) -> None:
        batch = int(item.progress["batchId"])
        if run.last_batch is not None and batch <= run.last_batch:
            return  # the same batch again (Spark reports a batch once; an idle re-report is not a checkpoint)
        job_id = self._ensure_job(item, run, item.progress, create=True)
        body = checkpoint_of(item.progress)
        try:
            self.client.report_checkpoint(job_id, body)
            self._count("reported")
        except Conflict as exc:
            self._conflict(job_id, batch, exc)
        run.last_batch = batch

    def _conflict(self, job_id: int, batch: int, exc: Conflict) -> None:
        """A 409: the batch was recorded before (a batch re-run after a restart), or its id is below the job's
        next id. Neither is retried: the coordinator keeps what it has."""
        try:
            cp = self.client.get_checkpoint(job_id, batch)
        except NotFound:
            cp = None
        if cp is not None and cp.status == CheckpointStatus.completed:
            log.info(
                "overtake listener: batch %d of job %d was recorded before; kept as it is", batch, job_id
            )
            self._count("duplicates")
        else:
            log.warning("overtake listener: job %d refused batch %d: %s", job_id, batch, exc)
            self._count("rejected")

    def _finish(self, item: Terminated, run: _Run) -> None:
        if run.ended:
            return
        job_id = self._ensure_job(item, run, item.last_progress, create=True)
        message = failure_message(item.exception)
        status = "FAILED" if item.exception else "FINISHED"
        try:
            # only this run's attempt may end the job: Spark tells listeners of a restart's start before the
            # last progress and the end of the run before it
            self.client.finish_job(job_id, status, message, attempt=run.attempt)
        except Conflict:
            job = self.client.get_job(job_id)
            if job.current_attempt == run.attempt and job.status not in TERMINAL_JOB_STATUSES:
                raise
            log.info(
                "overtake listener: job %d is %s on attempt %s; the end of attempt %s changes nothing",
                job_id,
                job.status.value,
                job.current_attempt,
                run.attempt,
            )
        run.ended = True
        self._runs.pop(item.run_id, None)
        log.info("overtake listener: job %d of query %s is %s", job_id, item.query_id, status)

    # ------------------------------------------------------------------------------------------- stats

    def _refused(self, item: Item) -> None:
        if isinstance(item, Progress):
            self._count("rejected")

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)

    def snapshot_stats(self) -> Stats:
        with self._lock:
            return Stats(
                reported=self.stats.reported,
                duplicates=self.stats.duplicates,
                rejected=self.stats.rejected,
                dropped=self.outbox.dropped,
                pending=self.outbox.pending(),
                jobs=dict(self._jobs),
            )


def _describe(item: Item) -> str:
    if isinstance(item, Progress):
        return f"batch {item.progress.get('batchId')} of query {item.query_id}"
    what = "start" if isinstance(item, Started) else "end"
    return f"the {what} of query {item.query_id}"
