"""``OvertakeClient``: the blocking SDK, running the shared endpoint descriptions on an ``httpx.Client``."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import TypeVar

import httpx

from client._endpoints import Endpoints
from client._http import Call, ClientConfig, EventStream, RetryPolicy
from client.sse import SSEDecoder, iter_sse
from contract.models import Event

T = TypeVar("T")


class OvertakeClient(Endpoints):
    """Talks to an Overtake coordinator.

    ``base_url`` defaults to ``$OVERTAKE_URL``, then ``http://127.0.0.1:8321``; ``token`` to ``$OVERTAKE_TOKEN``.
    Idempotent calls are retried ``retries`` times with exponential backoff from ``backoff`` seconds, each wait (a
    ``Retry-After`` too) at most ``max_backoff`` seconds.
    Use it as a context manager, or call ``close()``.
    """

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        retries: int = 5,
        backoff: float = 0.2,
        transport: httpx.BaseTransport | None = None,
        max_backoff: float = 10.0,
    ) -> None:
        self.config = ClientConfig.resolve(base_url, token, timeout, retries, backoff, max_backoff)
        self._transport = transport
        self._http = httpx.Client(
            base_url=self.config.base_url,
            headers=self.config.headers(),
            timeout=timeout,
            transport=transport,
        )

    @property
    def base_url(self) -> str:
        return self.config.base_url

    def with_token(self, token: str | None) -> OvertakeClient:
        """A new client to the same coordinator with another token, e.g. an attempt's task token."""
        c = self.config
        return OvertakeClient(
            c.base_url, token or "", c.timeout, c.retries, c.backoff, self._transport, c.max_backoff
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> OvertakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, call: Call[T]) -> T:
        policy = RetryPolicy(self.config, call)
        tries = 0

        def once() -> httpx.Response:
            nonlocal tries
            tries += 1
            response = self._http.request(
                call.method,
                call.path,
                params=call.params,
                json=call.json,
                content=call.body.chunks() if call.body is not None else None,
                headers=call.headers,
                files=call.files,
            )
            response.read()
            return response

        try:
            response = policy.retrying(sleep=lambda seconds: time.sleep(seconds))(once)
        except httpx.TransportError as exc:
            raise policy.failed(exc, tries) from exc
        return policy.answer(response)

    def events(
        self,
        job_id: int,
        after: int | None = None,
        reconnect: bool = True,
        *,
        reconnect_forever: bool = False,
        max_reconnect_time: float | None = None,
    ) -> Iterator[Event]:
        """Follow the job's events (server-sent events). A dropped connection is reopened with ``Last-Event-ID``,
        so no event is lost or repeated; with ``reconnect=False`` the iterator ends when the stream does.

        By default a stream that cannot be reopened ``retries`` times in a row raises ``CoordinatorUnreachable``.
        With ``max_reconnect_time`` (seconds) it keeps reconnecting, with backoff capped at 10 s, until the
        coordinator has been unreachable that long without a break; with ``reconnect_forever=True`` for as long
        as the caller iterates (close the client, or stop iterating, to end it)."""
        limit = math.inf if reconnect_forever else max_reconnect_time
        stream = EventStream(self.config, job_id, after, reconnect, limit)
        while True:
            headers = stream.connecting()
            decoder = SSEDecoder()
            try:
                with self._http.stream(
                    "GET", stream.path, headers=headers, timeout=stream.timeout()
                ) as response:
                    if not response.is_success:
                        response.read()
                        time.sleep(stream.after_error_response(response))
                        continue
                    stream.opened()
                    for sse in iter_sse(response.iter_lines(), decoder):
                        event = stream.parse(sse.data)
                        if stream.seen(event, sse.retry):
                            yield event
            except httpx.TransportError as exc:
                if self._http.is_closed:  # closed (maybe from another thread) to end the stream
                    return
                time.sleep(stream.after_error(exc))
                continue
            delay = stream.after_close()
            if delay is None or self._http.is_closed:
                return
            time.sleep(delay)
