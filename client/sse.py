"""Server-sent events: an incremental parser of the ``text/event-stream`` format (WHATWG HTML, 9.2).

The parser is fed one line at a time (``httpx.Response.iter_lines`` already splits on CR, LF and CRLF) and
returns an event when a blank line ends one. It keeps the stream's last event id and reconnection delay, which
the clients use to resume a dropped stream with ``Last-Event-ID``.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class ServerSentEvent:
    event: str = "message"
    data: str = ""
    id: str | None = None
    retry: int | None = None


class SSEDecoder:
    """Turns lines into events. ``last_event_id`` survives across events, as the spec requires."""

    def __init__(self) -> None:
        self.last_event_id: str | None = None
        self.retry: int | None = None
        self._event = ""
        self._data: list[str] = []
        self._retry: int | None = None

    def decode(self, line: str) -> ServerSentEvent | None:
        line = line.rstrip("\r\n")
        if not line:
            return self._dispatch()
        if line.startswith(":"):  # a comment, e.g. a keep-alive ping
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            if "\0" not in value:
                self.last_event_id = value
        elif name == "retry":
            if value.isdigit():
                self._retry = self.retry = int(value)
        # any other field is ignored
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        event, data, retry = self._event or "message", self._data, self._retry
        self._event, self._data, self._retry = "", [], None
        if not data:
            return None
        return ServerSentEvent(event=event, data="\n".join(data), id=self.last_event_id, retry=retry)


def iter_sse(lines: Iterable[str], decoder: SSEDecoder | None = None) -> Iterator[ServerSentEvent]:
    decoder = decoder or SSEDecoder()
    for line in lines:
        sse = decoder.decode(line)
        if sse is not None:
            yield sse


async def aiter_sse(
    lines: AsyncIterable[str], decoder: SSEDecoder | None = None
) -> AsyncIterator[ServerSentEvent]:
    decoder = decoder or SSEDecoder()
    async for line in lines:
        sse = decoder.decode(line)
        if sse is not None:
            yield sse
