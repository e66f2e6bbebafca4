"""The event bus, chosen by URL (memory:// in-process, redis:// across replicas), and the per-job event log.

Events are written to the database in the transaction that causes them (numbered by a per-job
sequence taken under the job row lock, so they commit in order), and published on the bus only
after that commit. A stream reader replays the log after its Last-Event-ID, then follows the bus,
and fills any gap from the log — so a reconnecting client never misses an event, and a lost
pub/sub message only delays one.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any, Protocol

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import EventRow, JobRow
from client.models import Event, EventType

log = logging.getLogger(__name__)
REDIS_CHANNEL = "overtake:events"


def emit(session: AsyncSession, job: JobRow, type_: EventType, data: dict[str, Any], now: int) -> Event:
    """Record an event in the job's log; it is published once the transaction commits."""
    job.event_seq = (job.event_seq or 0) + 1
    event = Event(id=job.event_seq, job_id=job.id, type=type_, timestamp=now, data=data)
    session.add(EventRow(job_id=job.id, seq=event.id, type=type_.value, ts=now, data=data))
    session.info.setdefault("overtake_events", []).append(event)
    return event


def pending_events(session: AsyncSession) -> list[Event]:
    return session.info.pop("overtake_events", [])


async def read_log(session: AsyncSession, job_id: int, after: int, limit: int = 1000) -> list[Event]:
    rows = (
        await session.execute(
            select(EventRow)
            .where(EventRow.job_id == job_id, EventRow.seq > after)
            .order_by(EventRow.seq)
            .limit(limit)
        )
    ).scalars()
    return [
        Event(id=r.seq, job_id=r.job_id, type=EventType(r.type), timestamp=r.ts, data=r.data) for r in rows
    ]


async def trim_log(session: AsyncSession, job_id: int, keep_after: int) -> None:
    await session.execute(delete(EventRow).where(EventRow.job_id == job_id, EventRow.seq <= keep_after))


class EventBus(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def publish(self, events: list[Event]) -> None: ...
    def subscribe(self, job_id: int) -> asyncio.Queue[Event]: ...
    def unsubscribe(self, job_id: int, queue: asyncio.Queue[Event]) -> None: ...
    def add_listener(self, callback) -> None: ...
    async def ping(self) -> None: ...


class MemoryBus:
    """In-process fan-out to the local subscribers."""

    url = "memory://"

    def __init__(self) -> None:
        self._subs: dict[int, set[asyncio.Queue[Event]]] = defaultdict(set)
        self._listeners: list = []

    def add_listener(self, callback) -> None:
        """Call `callback(event)` for every event delivered to this process (from any replica)."""
        self._listeners.append(callback)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def subscribe(self, job_id: int) -> asyncio.Queue[Event]:
        q: asyncio.Queue[Event] = asyncio.Queue(maxsize=10_000)
        self._subs[job_id].add(q)
        return q

    def unsubscribe(self, job_id: int, queue: asyncio.Queue[Event]) -> None:
        self._subs[job_id].discard(queue)
        if not self._subs[job_id]:
            self._subs.pop(job_id, None)

    def deliver(self, event: Event) -> None:
        for callback in self._listeners:
            callback(event)
        for q in list(self._subs.get(event.job_id, ())):
            try:
                q.put_nowait(event)
            except asyncio.QueueFull:
                pass  # the reader falls behind; it refills from the log

    async def publish(self, events: list[Event]) -> None:
        for e in events:
            self.deliver(e)

    async def ping(self) -> None:
        return None


class RedisBus(MemoryBus):
    """Publishes on a Redis channel; every replica's listener delivers to its local subscribers."""

    def __init__(self, url: str) -> None:
        super().__init__()
        import redis.asyncio as aioredis

        self.url = url
        self._redis = aioredis.from_url(url, socket_connect_timeout=5, health_check_interval=15)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="overtake-redis-listener")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        await self._redis.aclose()

    async def _listen(self) -> None:
        while True:
            try:
                pubsub = self._redis.pubsub()
                await pubsub.subscribe(REDIS_CHANNEL)
                async for msg in pubsub.listen():
                    if msg.get("type") != "message":
                        continue
                    try:
                        self.deliver(Event.model_validate_json(msg["data"]))
                    except Exception:  # noqa: BLE001 - a bad message must not stop the listener
                        log.warning("ignoring a malformed event on %s", REDIS_CHANNEL)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                log.warning("redis event listener lost its connection (%s); reconnecting", exc)
                await asyncio.sleep(0.5)

    async def publish(self, events: list[Event]) -> None:
        try:
            for e in events:
                await self._redis.publish(REDIS_CHANNEL, e.model_dump_json())
        except Exception as exc:  # noqa: BLE001 - readers fall back to the log
            log.warning(
                "could not publish %d events to redis (%s); readers will find them in the log",
                len(events),
                exc,
            )
            for e in events:
                self.deliver(e)

    async def ping(self) -> None:
        await self._redis.ping()


def event_bus_from_url(url: str) -> EventBus:
    if url.startswith("memory://"):
        return MemoryBus()
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisBus(url)
    raise ValueError(f"unsupported event bus URL {url!r}: use memory:// or redis://host:port/db")


def to_sse(event: Event) -> dict[str, str]:
    return {"id": str(event.id), "event": event.type.value, "data": json.dumps(event.model_dump(mode="json"))}


async def follow(
    bus: EventBus,
    read: Any,
    job_id: int,
    after: int,
    poll_interval: float = 1.0,
) -> AsyncIterator[Event]:
    """Events of a job after `after`, in order, without gaps: the log first, then the bus, gaps from the log.

    `read(after) -> list[Event]` reads the log.
    """
    queue = bus.subscribe(job_id)
    last = after
    try:
        while True:
            for e in await read(last):
                if e.id > last:
                    last = e.id
                    yield e
            while True:
                try:
                    e = await asyncio.wait_for(queue.get(), timeout=poll_interval)
                except asyncio.TimeoutError:
                    break  # poll the log in case a notification was lost
                if e.id <= last:
                    continue
                if e.id == last + 1:
                    last = e.id
                    yield e
                else:
                    break  # a gap: read it from the log
    finally:
        bus.unsubscribe(job_id, queue)
