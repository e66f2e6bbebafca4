"""``AsyncOvertakeClient``: the asyncio SDK, running the shared endpoint descriptions on an ``httpx.AsyncClient``.

Every method of ``OvertakeClient`` exists here with the same arguments and is awaited; ``events`` is an async
iterator.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterator
from typing import TypeVar

import anyio
import anyio.to_thread
import httpx

from client._endpoints import Endpoints
from client._http import Body, Call, ClientConfig, EventStream, RetryPolicy
from client.sse import SSEDecoder, aiter_sse
from contract.models import Event

T = TypeVar("T")

_DONE = object()


async def _async_chunks(body: Body) -> AsyncIterator[bytes]:
    chunks: Iterator[bytes] = iter(body.chunks())
    if not body.blocking:
        for chunk in chunks:
            yield chunk
        return
    try:
        while True:
            chunk = await anyio.to_thread.run_sync(next, chunks, _DONE)
            if chunk is _DONE:
                return
            yield chunk
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


class AsyncOvertakeClient(Endpoints):
    """The async twin of ``OvertakeClient``: same constructor, same methods, awaited."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        retries: int = 5,
        backoff: float = 0.2,
        transport: httpx.AsyncBaseTransport | None = None,
        max_backoff: float = 10.0,
    ) -> None:
        self.config = ClientConfig.resolve(base_url, token, timeout, retries, backoff, max_backoff)
        self._transport = transport
        self._http = httpx.AsyncClient(
            base_url=self.config.base_url,
            headers=self.config.headers(),
            timeout=timeout,
            transport=transport,
        )

    @property
    def base_url(self) -> str:
        return self.config.base_url

    def with_token(self, token: str | None) -> AsyncOvertakeClient:
        """A new client to the same coordinator with another token, e.g. an attempt's task token."""
        c = self.config
        return AsyncOvertakeClient(
            c.base_url, token or "", c.timeout, c.retries, c.backoff, self._transport, c.max_backoff
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncOvertakeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, call: Call[T]) -> T:
        policy = RetryPolicy(self.config, call)
        tries = 0

        async def once() -> httpx.Response:
            nonlocal tries
            tries += 1
            response = await self._http.request(
                call.method,
                call.path,
                params=call.params,
                json=call.json,
                content=_async_chunks(call.body) if call.body is not None else None,
                headers=call.headers,
                files=call.files,
            )
            await response.aread()
            return response

        async def sleep(seconds: float) -> None:
            await anyio.sleep(seconds)

        try:
            response = await policy.async_retrying(sleep=sleep)(once)
        except httpx.TransportError as exc:
            raise policy.failed(exc, tries) from exc
        return policy.answer(response)

    async def events(
        self,
        job_id: int,
        after: int | None = None,
        reconnect: bool = True,
        *,
        reconnect_forever: bool = False,
        max_reconnect_time: float | None = None,
    ) -> AsyncIterator[Event]:
        """Follow the job's events; see ``OvertakeClient.events``."""
        limit = math.inf if reconnect_forever else max_reconnect_time
        stream = EventStream(self.config, job_id, after, reconnect, limit)
        while True:
            headers = stream.connecting()
            decoder = SSEDecoder()
            try:
                async with self._http.stream(
                    "GET", stream.path, headers=headers, timeout=stream.timeout()
                ) as response:
                    if not response.is_success:
                        await response.aread()
                        await anyio.sleep(stream.after_error_response(response))
                        continue
                    stream.opened()
                    async for sse in aiter_sse(response.aiter_lines(), decoder):
                        event = stream.parse(sse.data)
                        if stream.seen(event, sse.retry):
                            yield event
            except httpx.TransportError as exc:
                if self._http.is_closed:  # closed (maybe from another thread) to end the stream
                    return
                await anyio.sleep(stream.after_error(exc))
                continue
            delay = stream.after_close()
            if delay is None or self._http.is_closed:
                return
            await anyio.sleep(delay)
