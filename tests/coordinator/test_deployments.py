"""Two deployments sharing one Redis: each event carries its deployment's identity, and each job's stream carries
exactly its own deployment's events, although both deployments number their jobs and events alike."""

from __future__ import annotations

import asyncio
import threading

import pytest

from app.events import MemoryBus, follow
from app.settings import Settings
from client.sync import OvertakeClient
from contract.models import Event, EventType
from tests.live import LiveCoordinator

pytestmark = [pytest.mark.redis]


def test_the_default_namespace_is_shared_by_replicas_of_one_database_and_differs_between_databases(tmp_path):
    pg = "postgresql+asyncpg://overtake:secret@db:5432/overtake"
    replica_a = Settings(data_dir=tmp_path / "a", database_url=pg)
    replica_b = Settings(data_dir=tmp_path / "b", database_url=pg.replace("secret", "other-password"))
    other = Settings(data_dir=tmp_path / "c", database_url=pg.replace("/overtake", "/elsewhere"))
    assert replica_a.effective_namespace == replica_b.effective_namespace
    assert replica_a.effective_namespace != other.effective_namespace
    assert Settings(data_dir=tmp_path / "a").effective_namespace != Settings(data_dir=tmp_path / "c").effective_namespace
    assert Settings(data_dir=tmp_path, namespace="prod-eu").effective_namespace == "prod-eu"


def test_replicas_that_spell_the_database_host_in_another_case_share_the_default_namespace(tmp_path):
    """A host name is case-insensitive: replicas configured with DB.internal and db.internal use one database, so
    one namespace (otherwise each drops the other's events from Redis as another deployment's). The database's
    name and the user keep their case: PostgreSQL tells them apart by it."""
    pg = "postgresql+asyncpg://overtake:secret@db.internal:5432/overtake"

    def namespace(url: str) -> str:
        return Settings(data_dir=tmp_path, database_url=url).effective_namespace

    assert namespace(pg.replace("db.internal", "DB.Internal")) == namespace(pg)
    assert namespace(pg.replace("/overtake", "/Overtake")) != namespace(pg)
    assert namespace(pg.replace("overtake:", "Overtake:")) != namespace(pg)


def _event(id_: int, deployment: str, job_id: int = 1) -> Event:
    return Event(id=id_, job_id=job_id, type=EventType.checkpoint_aborted, timestamp=0, data={}, deployment=deployment)


async def test_follow_does_not_pass_on_a_foreign_event_numbered_next():
    bus = MemoryBus("mine")
    log = [_event(1, "mine"), _event(2, "mine")]

    async def read(after: int) -> list[Event]:
        return [e for e in log if e.id > after]

    stream = follow(bus, read, 1, 1, poll_interval=0.05)
    first = await stream.__anext__()  # event 2 from the log; the subscription is open now
    assert first.id == 2
    (queue,) = bus._subs[1]
    queue.put_nowait(_event(3, "theirs"))  # a foreign event 3, as if it came through a shared channel
    log.append(_event(3, "mine"))
    nxt = await asyncio.wait_for(stream.__anext__(), 10)
    await stream.aclose()
    assert (nxt.id, nxt.deployment) == (3, "mine")


async def test_follow_catches_up_a_log_longer_than_one_read_without_waiting_for_the_bus():
    """A read returns one page of the log (1,000 events): a stream resuming far behind read a page, then waited a
    poll interval for the bus before the next, so catching up on a quiet job's 20,000 retained events took
    twenty intervals. It reads page after page until the log has nothing newer."""
    bus = MemoryBus("mine")
    log = [_event(i, "mine") for i in range(1, 8)]

    async def read(after: int) -> list[Event]:
        return [e for e in log if e.id > after][:2]

    stream = follow(bus, read, 1, 0, poll_interval=3600)
    got = [await asyncio.wait_for(stream.__anext__(), 10) for _ in log]
    await stream.aclose()
    assert [e.id for e in got] == [e.id for e in log]


def test_a_bus_drops_what_another_deployment_publishes():
    bus = MemoryBus("mine")
    queue = bus.subscribe(1)
    bus.deliver(_event(1, "theirs"))
    bus.deliver(_event(1, "mine"))
    assert queue.qsize() == 1 and queue.get_nowait().deployment == "mine"
    assert bus.dropped_foreign == 1


def _follow(url: str, job_id: int, want: int, out: list[Event], ready: threading.Event) -> None:
    with OvertakeClient(url) as c:
        events = c.events(job_id, after=1)
        ready.set()
        for e in events:
            out.append(e)
            if len(out) >= want:
                return


@pytest.mark.slow
def test_two_deployments_on_one_redis_each_stream_carries_exactly_its_own_events(tmp_path, redis_url):
    env = {"OVERTAKE_REDIS_URL": redis_url}
    x = LiveCoordinator(tmp_path / "x", env).start()
    y = LiveCoordinator(tmp_path / "y", env).start()
    try:
        clients = {name: OvertakeClient(c.url) for name, c in (("x", x), ("y", y))}
        job = {"name": "same", "graph": {"vertices": [{"id": "src", "parallelism": 1}]},
               "checkpoint": {"max_concurrent": 100}}
        jobs = {name: c.create_job(job) for name, c in clients.items()}
        assert jobs["x"].id == jobs["y"].id  # both deployments number their jobs alike
        for name, c in clients.items():
            c.start_attempt(jobs[name].id)  # event 1 of each
        want = {"x": 12, "y": 12}
        received: dict[str, list[Event]] = {"x": [], "y": []}
        threads = []
        for name, coordinator in (("x", x), ("y", y)):
            ready = threading.Event()
            t = threading.Thread(
                target=_follow, args=(coordinator.url, jobs[name].id, want[name], received[name], ready), daemon=True
            )
            t.start()
            ready.wait(10)
            threads.append(t)
        for i in range(12):  # interleaved: both deployments emit event 2, 3, ... for job 1
            clients["x"].trigger_checkpoint(jobs["x"].id)
            cp = clients["y"].trigger_checkpoint(jobs["y"].id)
            if i % 2:
                clients["y"].decline(jobs["y"].id, cp.id, {"attempt": 1, "vertex": "src", "subtask_index": 0,
                                                           "reason": "test"})
        for t in threads:
            t.join(60)
        for name, c in clients.items():
            own = c.event_history(jobs[name].id, after=1)[: want[name]]
            namespace = own[0].deployment
            assert namespace and all(e.deployment == namespace for e in own)
            got = received[name]
            assert [(e.id, e.type, e.data, e.deployment) for e in got] == [
                (e.id, e.type, e.data, e.deployment) for e in own
            ], f"deployment {name}'s stream carried events that are not its own"
        assert received["x"][0].deployment != received["y"][0].deployment
        for c in clients.values():
            c.close()
    finally:
        x.stop()
        y.stop()
