"""The event bus, chosen by URL (memory:// in-process, redis:// across replicas), and the per-job event log.

Every event carries its deployment's identity (`deployment`, the `OVERTAKE_NAMESPACE` setting, by default derived
from the database URL: replicas of one deployment share it). The Redis channel is named after it, and a
subscriber drops an event of another deployment, so deployments sharing one Redis never see each other's events.

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
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any, Protocol

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import EventRow, JobRow
from app.registry import SchemeRegistry
from contract.events import EventPayload
from contract.models import Event, EventType

log = logging.getLogger(__name__)


def redis_channel(namespace: str) -> str:
    return f"overtake:{namespace}:events"


def emit(session: AsyncSession, job: JobRow, payload: EventPayload, now: int) -> Event:
    """Record an event in the job's log; it is published once the transaction commits."""
    event, row = numbered(session, job, payload, now)
    job.event_seq = event.id
    session.add(EventRow(**row))
    return event


def numbered(session: AsyncSession, job: JobRow, payload: EventPayload, now: int) -> tuple[Event, dict[str, Any]]:
    """The job's next event and its log row, to be published once the transaction commits. The caller inserts
    the row and advances `job.event_seq` to the event's number (`emit` does both through the session)."""
    data = payload.data()
    event = Event(id=(job.event_seq or 0) + 1, job_id=job.id, type=payload.type, timestamp=now, data=data)
    session.info.setdefault("overtake_events", []).append(event)
    return event, {"job_id": job.id, "seq": event.id, "type": payload.type.value, "ts": now, "data": data}


def pending_events(session: AsyncSession) -> list[Event]:
    return session.info.pop("overtake_events", [])


async def read_log(
    session: AsyncSession, job_id: int, after: int, limit: int = 1000, deployment: str | None = None
) -> list[Event]:
    rows = (
        await session.execute(
            select(EventRow)
            .where(EventRow.job_id == job_id, EventRow.seq > after)
            .order_by(EventRow.seq)
            .limit(limit)
        )
    ).scalars()
    return [
        Event(id=r.seq, job_id=r.job_id, type=EventType(r.type), timestamp=r.ts, data=r.data, deployment=deployment)
        for r in rows
    ]


async def trim_log(session: AsyncSession, job_id: int, keep_after: int) -> None:
    await session.execute(delete(EventRow).where(EventRow.job_id == job_id, EventRow.seq <= keep_after))


class EventBus(Protocol):
    namespace: str

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

    def __init__(self, namespace: str = "default") -> None:
        self.namespace = namespace
        self.dropped_foreign = 0
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
        if event.deployment != self.namespace:
            self.dropped_foreign += 1  # another deployment's event: never ours, whatever its job id and number
            return
        for callback in self._listeners:
            callback(event)
        for q in list(self._subs.get(event.job_id, ())):
            try:
                q.put_nowait(event)
            except asyncio.QueueFull:
                pass  # the reader falls behind; it refills from the log

    async def publish(self, events: list[Event]) -> None:
        for e in events:
            self.deliver(self.stamp(e))

    def stamp(self, event: Event) -> Event:
        """The event as this deployment publishes it: with its identity."""
        return event if event.deployment == self.namespace else event.model_copy(update={"deployment": self.namespace})

    async def ping(self) -> None:
        return None


PUBLISH_TIMEOUT = 1.0
"""Seconds a commit's events may take to reach Redis before they are left to the log."""
QUIET_AFTER_FAILURE = 5.0
"""Seconds after a failed publish during which events are not sent to Redis (a partition costs one wait, not one per
request)."""


class RedisBus(MemoryBus):
    """Publishes on a Redis channel; every replica's listener delivers to its local subscribers."""

    def __init__(self, url: str, namespace: str = "default") -> None:
        super().__init__(namespace)
        import redis.asyncio as aioredis

        self.url = url
        self.channel = redis_channel(namespace)
        self._redis = aioredis.from_url(url, socket_connect_timeout=5, health_check_interval=15)
        self._task: asyncio.Task[None] | None = None
        self._quiet_until = 0.0  # monotonic: after a failed publish, Redis is left alone until then

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
            pubsub = self._redis.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                async for msg in pubsub.listen():
                    if msg.get("type") != "message":
                        continue
                    try:
                        self.deliver(Event.model_validate_json(msg["data"]))
                    except Exception:  # noqa: BLE001 - a bad message must not stop the listener
                        log.warning("ignoring a malformed event on %s", self.channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                log.warning("redis event listener lost its connection (%s); reconnecting", exc)
                await asyncio.sleep(0.5)
            finally:
                # the lost subscription's connection goes back (a reconnect opened a new one and kept the old)
                try:
                    await asyncio.wait_for(pubsub.aclose(), PUBLISH_TIMEOUT)
                except Exception:  # noqa: BLE001 - it is gone already
                    pass

    async def publish(self, events: list[Event]) -> None:
        """Publish a commit's events (they are in the log already). Bounded by `PUBLISH_TIMEOUT`: a Redis that does
        not answer (a partition: no refusal, no reset) would hold every request that emits events, the ack
        committer's batches among them. After a failure, events go to this replica's streams only for
        `QUIET_AFTER_FAILURE` seconds (the other replicas' streams read them from the log), then Redis is tried
        again."""
        events = [self.stamp(e) for e in events]
        if time.monotonic() >= self._quiet_until:
            try:
                await asyncio.wait_for(self._send(events), PUBLISH_TIMEOUT)
                return
            except Exception as exc:  # noqa: BLE001 - readers fall back to the log
                self._quiet_until = time.monotonic() + QUIET_AFTER_FAILURE
                log.warning(
                    "could not publish %d events to redis (%r); readers will find them in the log, and for the next "
                    "%g s events reach only this replica's streams directly",
                    len(events),
                    exc,
                    QUIET_AFTER_FAILURE,
                )
        for e in events:
            self.deliver(e)

    async def _send(self, events: list[Event]) -> None:
        for e in events:
            await self._redis.publish(self.channel, e.model_dump_json())

    async def ping(self) -> None:
        await self._redis.ping()


EVENT_BUSES: SchemeRegistry[EventBus] = SchemeRegistry(
    "event bus", "OVERTAKE_REDIS_URL", "redis://host:6379/0 (unset: memory://, in-process)"
)
EVENT_BUSES.register("memory", lambda url, namespace: MemoryBus(namespace))
for _scheme in ("redis", "rediss", "unix"):
    EVENT_BUSES.register(_scheme, lambda url, namespace: RedisBus(url, namespace))


def event_bus_from_url(url: str, namespace: str = "default") -> EventBus:
    """The event bus for the URL's scheme, from the table of known event-bus schemes."""
    return EVENT_BUSES.create(url, namespace=namespace)


def to_sse(event: Event) -> dict[str, str]:
    return {"id": str(event.id), "event": event.type.value, "data": json.dumps(event.model_dump(mode="json"))}


def ends_attempt(event: Event, attempt: int | None) -> bool:
    """Whether `event` starts an attempt after `attempt`: a task token of `attempt` stops working with it, so a
    reader holding one gets nothing past it (the write targets of the new attempt's checkpoints least of all).
    `attempt` None: the admin token, or no auth."""
    return (
        attempt is not None
        and event.type == EventType.attempt_started
        and int(event.data.get("attempt") or 0) > attempt
    )


async def follow(
    bus: EventBus,
    read: Any,
    job_id: int,
    after: int,
    poll_interval: float = 1.0,
    attempt: int | None = None,
) -> AsyncIterator[Event]:
    """Events of a job after `after`, in order, without gaps: the log first, then the bus, gaps from the log.

    `read(after) -> list[Event]` reads the log. Only this deployment's events of this job are passed on.
    `attempt`: the attempt of the reader's task token (None: admin, or no auth); its stream ends with the event
    that starts a later attempt, as the token does, however long the stream was open before.
    """
    queue = bus.subscribe(job_id)
    last = after
    try:
        while True:
            behind = False
            for e in await read(last):
                if e.id > last:
                    last, behind = e.id, True
                    yield e
                    if ends_attempt(e, attempt):
                        return
            if behind:
                continue  # a read returns one page of the log: read on until it has nothing newer, then wait
            while True:
                try:
                    e = await asyncio.wait_for(queue.get(), timeout=poll_interval)
                except asyncio.TimeoutError:
                    break  # poll the log in case a notification was lost
                if e.id <= last or e.job_id != job_id or e.deployment != bus.namespace:
                    continue
                if e.id == last + 1:
                    last = e.id
                    yield e
                    if ends_attempt(e, attempt):
                        return
                else:
                    break  # a gap: read it from the log
    finally:
        bus.unsubscribe(job_id, queue)
