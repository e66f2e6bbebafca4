"""A streamed `multipart/form-data` reader for `acks/with-state`: parts are read one after the other straight from
the request as they arrive (python-multipart's push parser), so a blob part goes into the blob store's staging
while it arrives and is refused as soon as it passes its limit; nothing is spooled whole first."""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from app.errors import Invalid, TooLarge


@dataclass
class Part:
    name: str
    filename: str | None
    content_type: str | None


class MultipartStream:
    """`next_part()` opens the next part (None at the end); `chunks()` yields the open part's bytes."""

    def __init__(self, body: AsyncIterator[bytes], content_type: str) -> None:
        kind, options = parse_options_header(content_type)
        boundary = options.get(b"boundary")
        if kind != b"multipart/form-data" or not boundary:
            raise Invalid(f"send multipart/form-data with a boundary (got content type {content_type!r})")
        self._body = body
        self._events: deque[tuple] = deque()
        self._header_name = b""
        self._header_value = b""
        self._headers: dict[bytes, bytes] = {}
        self._done = False
        self._in_part = False
        try:
            self._parser = self._new_parser(boundary)
        except FormParserError as exc:  # a boundary the parser refuses (longer than it takes)
            raise Invalid(f"the multipart boundary cannot be used: {exc}; nothing was stored") from None

    def _new_parser(self, boundary: bytes) -> MultipartParser:
        return MultipartParser(
            boundary,
            {
                "on_part_begin": self._begin,
                "on_part_data": lambda data, start, end: self._events.append(("data", bytes(data[start:end]))),
                "on_part_end": lambda: self._events.append(("end",)),
                "on_header_field": self._field,
                "on_header_value": self._value,
                "on_header_end": self._header_end,
                "on_headers_finished": lambda: self._events.append(("headers", dict(self._headers))),
                "on_end": lambda: self._events.append(("finished",)),
            },
        )

    def _begin(self) -> None:
        self._headers = {}

    def _field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        self._headers[self._header_name.lower()] = self._header_value
        self._header_name, self._header_value = b"", b""

    async def _event(self) -> tuple:
        while not self._events:
            if self._done:
                raise Invalid("the multipart body ended before its closing boundary; nothing was stored")
            try:
                chunk = await self._body.__anext__()
            except StopAsyncIteration:
                self._done = True
                self._parser.finalize()
                continue
            try:
                self._parser.write(chunk)
            except FormParserError as exc:  # MultipartParseError and the parser's other refusals
                raise Invalid(f"the multipart body cannot be read: {exc}; nothing was stored") from None
        return self._events.popleft()

    async def next_part(self) -> Part | None:
        """The next part's name and headers, after skipping what is left of the current one; None at the end."""
        while True:
            event = await self._event()
            if event[0] == "finished":
                return None
            if event[0] == "headers":
                disposition = event[1].get(b"content-disposition", b"")
                _, options = parse_options_header(disposition)
                name = options.get(b"name")
                if name is None:
                    raise Invalid("a multipart part has no Content-Disposition name; nothing was stored")
                filename = options.get(b"filename")
                ctype = event[1].get(b"content-type")
                self._in_part = True
                return Part(
                    name.decode("latin-1"),
                    filename.decode("latin-1") if filename is not None else None,
                    ctype.decode("latin-1") if ctype is not None else None,
                )

    async def chunks(self, limit: int, what: str) -> AsyncIterator[bytes]:
        """The open part's bytes as they arrive; TooLarge as soon as they pass `limit`."""
        seen = 0
        while self._in_part:
            event = await self._event()
            if event[0] == "end":
                self._in_part = False
            elif event[0] == "data" and event[1]:
                seen += len(event[1])
                if seen > limit:
                    raise TooLarge(f"{what} passes its limit of {limit} bytes; nothing was stored")
                yield event[1]

    async def read(self, limit: int, what: str) -> bytes:
        return b"".join([c async for c in self.chunks(limit, what)])
