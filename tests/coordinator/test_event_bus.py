"""The Redis event bus behind a partition: a Redis that accepts connections and never answers holds no request."""

from __future__ import annotations

import asyncio

from app import events
from app.events import RedisBus
from contract.models import Event, EventType


def _event(id_: int) -> Event:
    return Event(id=id_, job_id=1, type=EventType.checkpoint_aborted, timestamp=0, data={})


async def test_a_redis_that_never_answers_holds_a_publish_for_its_bound_once_and_events_reach_local_streams(
    monkeypatch,
):
    received = bytearray()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):  # takes every command, answers none
            received.extend(data)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setattr(events, "PUBLISH_TIMEOUT", 0.2)
    bus = RedisBus(f"redis://127.0.0.1:{port}/0", "mine")
    queue = bus.subscribe(1)
    try:
        # bounded: without the bound the publish waits for the never-coming answer (the test's own guard: 30 s)
        await asyncio.wait_for(bus.publish([_event(1)]), 30)
        assert (await asyncio.wait_for(queue.get(), 5)).id == 1  # delivered to this replica's streams anyway
        assert received  # it was tried (the connection's first command waits for its answer)
        tried = len(received)
        await asyncio.wait_for(bus.publish([_event(2)]), 30)  # within the quiet period: Redis is left alone
        assert (await asyncio.wait_for(queue.get(), 5)).id == 2
        assert len(received) == tried

        monkeypatch.setattr(bus, "_quiet_until", 0.0)  # the quiet period is over: Redis is tried again
        await asyncio.wait_for(bus.publish([_event(3)]), 30)
        assert len(received) > tried and (await asyncio.wait_for(queue.get(), 5)).id == 3
    finally:
        bus.unsubscribe(1, queue)
        await bus._redis.aclose()
        server.close()


async def test_the_redis_listener_closes_a_lost_subscription_before_it_subscribes_again(monkeypatch):
    """Each reconnect opened a subscription and kept the lost one's connection: one leaked per Redis outage."""
    made = []

    class Subscription:
        def __init__(self) -> None:
            self.closed = False
            made.append(self)

        async def subscribe(self, channel: str) -> None:
            if len(made) == 1:
                raise ConnectionError("the connection to Redis was lost")
            await asyncio.Event().wait()  # the second one listens until the bus stops

        async def aclose(self) -> None:
            self.closed = True

    bus = RedisBus("redis://127.0.0.1:1/0", "mine")  # never connected: the subscriptions are the ones above
    monkeypatch.setattr(bus._redis, "pubsub", Subscription)
    await bus.start()
    try:
        async def resubscribed() -> None:
            while len(made) < 2:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(resubscribed(), 30)
        assert made[0].closed and not made[1].closed
    finally:
        await bus.stop()
    assert made[1].closed
