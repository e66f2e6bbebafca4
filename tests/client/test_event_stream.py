"""Following a job's event stream: resume after the last seen id on reconnect, give up when told to."""

from __future__ import annotations

import itertools

import httpx
import pytest

from client.errors import CoordinatorUnreachable, NotFound, UnexpectedResponse
from client.sdk import AsyncOvertakeClient, OvertakeClient
from contract.models import EventType
from tests.client._fakes import Script, error, record_sleeps, sse_event

URL = "http://coordinator.test:8321"


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch):
    record_sleeps(monkeypatch)

    async def async_no_sleep(_):
        return None

    monkeypatch.setattr("client.aio.anyio.sleep", async_no_sleep)


def stream(*chunks, fail: Exception | None = None):
    """A 200 event-stream answer sending ``chunks``, then dropping the connection with ``fail`` (if given)."""

    def body():
        yield from chunks
        if fail is not None:
            raise fail

    async def abody():
        for chunk in chunks:
            yield chunk
        if fail is not None:
            raise fail

    def answer(request: httpx.Request) -> httpx.Response:
        content = abody() if request.extensions.get("test_async") else body()
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, content=content)

    return answer


def test_a_dropped_stream_is_resumed_after_the_last_event_seen():
    script = Script(
        stream(sse_event(1), b": ping\n\n", sse_event(2), fail=httpx.ReadError("reset")),
        error(503, "unavailable", "restarting"),
        stream(sse_event(3, "checkpoint.completed")),
    )
    c = OvertakeClient(URL, transport=httpx.MockTransport(script))
    seen = list(itertools.islice(c.events(1), 3))
    assert [e.id for e in seen] == [1, 2, 3]
    assert seen[2].type is EventType.checkpoint_completed
    assert "Last-Event-ID" not in script.requests[0].headers
    assert script.requests[1].headers["Last-Event-ID"] == "2"
    assert script.requests[2].headers["Last-Event-ID"] == "2"


def test_after_starts_the_stream_after_that_event():
    script = Script(stream(sse_event(8)))
    c = OvertakeClient(URL, transport=httpx.MockTransport(script))
    assert [e.id for e in c.events(1, after=7, reconnect=False)] == [8]
    assert script.requests[0].headers["Last-Event-ID"] == "7"
    assert script.requests[0].headers["Accept"] == "text/event-stream"


def test_without_reconnect_a_drop_raises_unreachable():
    script = Script(stream(sse_event(1), fail=httpx.RemoteProtocolError("peer closed connection")))
    c = OvertakeClient(URL, transport=httpx.MockTransport(script))
    events = c.events(1, reconnect=False)
    assert next(events).id == 1
    with pytest.raises(CoordinatorUnreachable, match=URL):
        next(events)


def test_a_stream_that_keeps_closing_empty_ends_after_the_retries():
    script = Script(*[stream() for _ in range(4)])
    c = OvertakeClient(URL, retries=3, transport=httpx.MockTransport(script))
    assert list(c.events(1)) == []
    assert len(script.requests) == 4


def test_an_unknown_job_is_not_retried():
    script = Script(error(404, "not_found", "job 5 does not exist"))
    c = OvertakeClient(URL, transport=httpx.MockTransport(script))
    with pytest.raises(NotFound, match="job 5 does not exist"):
        next(c.events(5))


async def test_the_async_stream_resumes_too():
    script = Script(
        stream(sse_event(1), fail=httpx.ReadError("reset")),
        stream(sse_event(2), sse_event(3)),
    )
    seen = []
    async with AsyncOvertakeClient(URL, transport=httpx.MockTransport(script.handle_async)) as c:
        async for event in c.events(1):
            seen.append(event.id)
            if len(seen) == 3:
                break
    assert seen == [1, 2, 3]
    assert script.requests[1].headers["Last-Event-ID"] == "1"


def test_closing_the_client_ends_a_followed_stream_quietly():
    script = Script(stream(sse_event(1), fail=httpx.ReadError("socket closed")))
    c = OvertakeClient(URL, transport=httpx.MockTransport(script))
    events = c.events(1)
    assert next(events).id == 1
    c.close()  # e.g. from another thread, to stop a subtask's event feed
    assert list(events) == []
    assert len(script.requests) == 1


def test_reconnect_forever_outlasts_any_number_of_failed_reconnects_and_resumes_after_the_last_event():
    outage = [httpx.ConnectError("refused")] * 12 + [error(503, "unavailable", "starting")] * 8
    script = Script(
        stream(sse_event(1), sse_event(2), fail=httpx.ReadError("reset")),
        *outage,
        stream(sse_event(2), sse_event(3)),  # a server that sends the last seen event again
    )
    c = OvertakeClient(URL, retries=3, transport=httpx.MockTransport(script))
    seen = list(itertools.islice(c.events(1, reconnect_forever=True), 3))
    assert [e.id for e in seen] == [1, 2, 3]  # nothing lost, nothing twice
    assert all(r.headers["Last-Event-ID"] == "2" for r in script.requests[1:])


async def test_the_async_client_reconnects_forever_too():
    script = Script(
        stream(sse_event(1), fail=httpx.ReadError("reset")),
        *[httpx.ConnectError("refused")] * 10,
        stream(sse_event(2)),
    )
    async with AsyncOvertakeClient(URL, retries=1, transport=httpx.MockTransport(script.handle_async)) as c:
        seen = []
        async for e in c.events(1, reconnect_forever=True):
            seen.append(e.id)
            if len(seen) == 2:
                break
    assert seen == [1, 2]


def test_max_reconnect_time_gives_up_once_the_coordinator_stayed_away_that_long():
    class Down:
        def __call__(self, request):
            raise httpx.ConnectError("refused")

    c = OvertakeClient(URL, retries=0, transport=httpx.MockTransport(Down()))
    with pytest.raises(CoordinatorUnreachable):
        list(c.events(1, max_reconnect_time=0.05))


def test_a_4xx_ends_a_stream_followed_forever():
    script = Script(error(401, "unauthorized", "this task token belongs to attempt 1 of job 1, which ended"))
    c = OvertakeClient(URL, transport=httpx.MockTransport(script))
    with pytest.raises(Exception, match="which ended"):
        list(c.events(1, reconnect_forever=True))


def test_a_stream_message_that_is_not_an_event_raises_unexpected_response_naming_the_stream():
    script = Script(stream(sse_event(1), b"data: {not an event}\n\n"))
    c = OvertakeClient(URL, transport=httpx.MockTransport(script))
    events = c.events(1)
    assert next(events).id == 1
    with pytest.raises(UnexpectedResponse, match="event stream of .*/api/v1/jobs/1/events sent a message that is not"):
        next(events)
