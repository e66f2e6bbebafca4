"""The coordinator's runtime context: database, blob store and event bus, and the transaction wrapper
that publishes events and cleans released checkpoints' prefixes only after a commit."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Protocol

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession

from app.blobstore import BlobStore, blob_store_from_url, checkpoint_prefix
from app.db.models import JobRow
from app.db.session import Database
from app.domain.cleanup import Cleaner, pending_cleanups
from app.errors import NotFound
from app.events import EventBus, event_bus_from_url, pending_events
from app.settings import Settings
from contract.models import RecoveryPhases, WriteTarget


class LiveBackpressure(Protocol):
    """What the context asks of the live metrics (`app.domain.live_metrics.LiveMetricsStore`)."""

    def max_backpressure(self, job_id: int, attempt: int, now: int) -> float | None: ...

    def phases(self, job_id: int, attempt: int, started_at: int, subtasks: int) -> RecoveryPhases | None: ...

log = logging.getLogger(__name__)
CLEANUP_DELAY = 0.05  # seconds between a commit and the deferred cleaning of what it released
CLEANUP_WAIT = 2.0  # seconds an answer waits at most for the cleaning of what its transaction released


def now_ms() -> int:
    return int(time.time() * 1000)


def after_commit(session: AsyncSession, fn: Callable[[], None]) -> None:
    """Run `fn` once the session's transaction has committed (metrics and such)."""
    session.info.setdefault("overtake_after_commit", []).append(fn)


class Context:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.db = Database(settings.effective_database_url, settings.db_pool_size, settings.db_timeout)
        self.store: BlobStore = blob_store_from_url(settings.effective_blob_url, settings.data_dir)
        self.bus: EventBus = event_bus_from_url(settings.event_bus_url, settings.effective_namespace)
        # An explicit blob URL may be given to other deployments too: it is claimed before anything is written into
        # it or deleted from it. The default store lies in this deployment's own data directory.
        owner = settings.effective_namespace if settings.blob_url else None
        self.cleaner = Cleaner(self.db, self.store, int(settings.late_write_grace * 1000), owner)
        self._background: set[asyncio.Task] = set()
        self.live: LiveBackpressure | None = None
        """The subtasks' live metrics this replica received (set by the app)."""

    def backpressure(self, job_id: int, attempt: int) -> float | None:
        """The highest recent backpressure of the job attempt's subtasks, as this replica heard it; None if unknown."""
        return self.live.max_backpressure(job_id, attempt, now_ms()) if self.live is not None else None

    @property
    def direct_writes(self) -> bool:
        """Whether subtasks write their state into the blob store themselves (OVERTAKE_STATE_WRITES=direct)."""
        return self.settings.state_writes == "direct"

    @asynccontextmanager
    async def tx(self, readonly: bool = False, defer_cleanup: bool = False) -> AsyncIterator[AsyncSession]:
        """One transaction; after it commits, publish its events, run its hooks and clean the prefixes of the
        checkpoints it released (`defer_cleanup`: in the background, so the caller's answer does not wait; otherwise
        the caller waits at most `CLEANUP_WAIT` seconds, then the cleaning goes on in the background: a store that
        does not answer must not hold up the answer, or the scheduler, for as long as its client retries)."""
        async with self.db.session(readonly=readonly) as s:
            yield s
            events = pending_events(s)
            hooks = s.info.pop("overtake_after_commit", [])
            released = pending_cleanups(s)
        if events:
            await self.bus.publish(events)
        for fn in hooks:
            fn()
        if released:
            if defer_cleanup:
                self._in_background(self._clean_later(released))
            else:
                cleaning = self._in_background(self.cleaner.clean_all(released, now_ms()))
                await asyncio.wait({cleaning}, timeout=CLEANUP_WAIT)
                if not cleaning.done():
                    log.warning(
                        "the blob store has not answered the cleaning of checkpoints %s within %g s; it goes on in "
                        "the background (the sweep retries what fails)",
                        released,
                        CLEANUP_WAIT,
                    )

    def _in_background(self, work) -> asyncio.Task:
        task = asyncio.create_task(work, name="overtake-cleanup")
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _clean_later(self, released: list[tuple[int, int]]) -> None:
        """A deferred cleaning starts `CLEANUP_DELAY` after its commit. Started at once, its first step (a session
        and a statement built) would run on the event loop between the commit and the requests that wait for it:
        the committed acks' answers would wait for it."""
        await asyncio.sleep(CLEANUP_DELAY)
        await self.cleaner.clean_all(released, now_ms())

    async def write_target(self, job_id: int, checkpoint_id: int, timeout_at: int) -> WriteTarget | None:
        """Where the subtasks write a checkpoint's state themselves, scoped to its prefix until its timeout; None
        when they upload it through the coordinator (OVERTAKE_STATE_WRITES=coordinator, or a store without)."""
        if not self.direct_writes:
            return None
        await self.cleaner.ensure_claimed()  # no subtask writes into a store another deployment holds
        prefix = checkpoint_prefix(job_id, checkpoint_id)
        return await self.store.write_target(prefix, timeout_at, self.settings.max_blob_size)

    async def sweep_state(self, now: int | None = None) -> int:
        """Clean the checkpoints whose cleaning is due (the scheduler's sweep); returns how many were tried."""
        return await self.cleaner.sweep(now_ms() if now is None else now)

    async def close(self) -> None:
        if self._background:
            _, stuck = await asyncio.wait(set(self._background), timeout=10)
            for task in stuck:  # a store that does not answer: the sweep of the next start cleans what is left
                task.cancel()
            if stuck:
                await asyncio.wait(stuck, timeout=1)
        await self.bus.stop()
        await self.db.dispose()


async def lock_job(
    s: AsyncSession, job_id: int, skip_locked: bool = False, wait_ms: int | None = None
) -> JobRow | None:
    """Load a job holding its row lock: every write on a job's checkpoints takes it first (one lock order).

    `skip_locked`: None at once when another transaction holds it. `wait_ms` (PostgreSQL): wait at most that long
    for it, then raise `LockWaitTimeout` (the transaction is lost: the caller's `tx` ends with it). The bound stays
    on the rest of the transaction (`set_config(..., true)`, as SET LOCAL): a later statement that waits longer for
    another lock fails the same way rather than hold the caller. SQLite has no row locks (one writer at a time):
    both are ignored there."""
    if wait_ms is not None and s.get_bind().dialect.name == "postgresql":
        await s.execute(text("SELECT set_config('lock_timeout', :t, true)"), {"t": f"{int(wait_ms)}ms"})
    stmt = select(JobRow).where(JobRow.id == job_id).with_for_update(skip_locked=skip_locked)
    return (await s.execute(stmt)).scalar_one_or_none()


async def get_job_or_404(s: AsyncSession, job_id: int, lock: bool = False) -> JobRow:
    job = await lock_job(s, job_id) if lock else await s.get(JobRow, job_id)
    if job is None:
        raise NotFound(f"job {job_id} does not exist; list jobs with GET /api/v1/jobs")
    return job


class BackgroundWorker:
    """A coroutine `_run` that runs for the life of the app: `start` launches it, `stop` cancels and awaits it."""

    name = "overtake-worker"
    _task: asyncio.Task | None = None

    async def _run(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
