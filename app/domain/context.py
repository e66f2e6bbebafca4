"""The coordinator's runtime context: database, blob store and event bus, and the transaction wrapper
that publishes events and deletes unreferenced blobs only after a commit."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.blobstore import BlobStore, blob_key, blob_store_from_url
from app.db.models import BlobRow, JobRow
from app.db.session import Database
from app.errors import NotFound
from app.events import EventBus, event_bus_from_url, pending_events
from app.observability import BLOBS_DELETED
from app.settings import Settings

log = logging.getLogger(__name__)


def now_ms() -> int:
    return int(time.time() * 1000)


def after_commit(session: AsyncSession, fn: Callable[[], None]) -> None:
    """Run `fn` once the session's transaction has committed (metrics and such)."""
    session.info.setdefault("overtake_after_commit", []).append(fn)


def delete_after_commit(session: AsyncSession, job_id: int, blob_ids: list[str]) -> None:
    session.info.setdefault("overtake_delete_blobs", []).extend((job_id, b) for b in blob_ids)


class Context:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.db = Database(settings.effective_database_url, settings.db_pool_size)
        self.store: BlobStore = blob_store_from_url(settings.effective_blob_url, settings.data_dir)
        self.bus: EventBus = event_bus_from_url(settings.event_bus_url)

    @asynccontextmanager
    async def tx(self, readonly: bool = False) -> AsyncIterator[AsyncSession]:
        """One transaction; after it commits, publish its events, run its hooks and delete released blobs."""
        async with self.db.session(readonly=readonly) as s:
            yield s
            events = pending_events(s)
            hooks = s.info.pop("overtake_after_commit", [])
            released = s.info.pop("overtake_delete_blobs", [])
        if events:
            await self.bus.publish(events)
        for fn in hooks:
            fn()
        if released:
            await self.delete_blobs(released)

    async def delete_blobs(self, released: list[tuple[int, str]]) -> None:
        """Remove released blobs' bytes, then their rows. Left-overs are retried by the scheduler's sweep."""
        done: list[str] = []
        for job_id, blob_id in released:
            try:
                await self.store.delete(blob_key(job_id, blob_id))
                done.append(blob_id)
            except Exception as exc:  # noqa: BLE001 - the sweep retries
                log.warning("could not delete blob %s of job %s: %s", blob_id, job_id, exc)
        if done:
            async with self.db.session() as s:
                await s.execute(delete(BlobRow).where(BlobRow.id.in_(done), BlobRow.status == "deleting"))
            BLOBS_DELETED.inc(len(done))

    async def sweep_released_blobs(self, limit: int = 500) -> int:
        async with self.db.session(readonly=True) as s:
            rows = (
                await s.execute(
                    select(BlobRow.job_id, BlobRow.id).where(BlobRow.status == "deleting").limit(limit)
                )
            ).all()
        if rows:
            await self.delete_blobs([(r[0], r[1]) for r in rows])
        return len(rows)

    async def close(self) -> None:
        await self.bus.stop()
        await self.db.dispose()


async def lock_job(s: AsyncSession, job_id: int, skip_locked: bool = False) -> JobRow | None:
    """Load a job holding its row lock: every write on a job's checkpoints takes it first (one lock order)."""
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
