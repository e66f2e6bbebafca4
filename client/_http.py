"""What the sync and async clients share below the endpoints: the description of one call, the retry policy,
the connection settings, and the bookkeeping of a resumable event stream.

Nothing here does I/O; ``client.sync`` and ``client.aio`` run these descriptions with httpx.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any, Generic, TypeVar

import httpx

from client.errors import CoordinatorUnreachable, OutcomeUnknown, OvertakeError, error_from_response
from client.models import Event

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:8321"
API = "/api/v1"


@dataclass(frozen=True)
class Body:
    """A request body that can be sent more than once (for retries): ``chunks()`` starts it again each time.

    ``blocking`` says that producing the chunks reads a file, so the async client reads them in a worker thread.
    """

    chunks: Callable[[], Iterable[bytes]]
    size: int
    blocking: bool = False


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how to read its answer. ``idempotent`` calls may be repeated after they reached the server."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: dict[str, Any] | None = None
    json: Any = None
    body: Body | None = None
    headers: dict[str, str] = field(default_factory=dict)
    idempotent: bool = True
    files: dict[str, Any] | None = None
    """A ``multipart/form-data`` body: its parts as httpx takes them (``(None, bytes, type)`` for a field)."""

    def describe(self) -> str:
        return f"{self.method} {self.path}"


@dataclass(frozen=True)
class ClientConfig:
    """Connection settings of a client; explicit arguments win over ``OVERTAKE_URL`` / ``OVERTAKE_TOKEN``."""

    base_url: str
    token: str | None
    timeout: float
    retries: int
    backoff: float
    max_backoff: float = 10.0

    @classmethod
    def resolve(
        cls,
        base_url: str | None,
        token: str | None,
        timeout: float,
        retries: int,
        backoff: float,
    ) -> ClientConfig:
        url = (base_url or os.environ.get("OVERTAKE_URL") or DEFAULT_URL).rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"coordinator URL {url!r} must start with http:// or https://")
        if retries < 0 or backoff < 0:
            raise ValueError(f"retries ({retries}) and backoff ({backoff}) must not be negative")
        return cls(
            url,
            token if token is not None else os.environ.get("OVERTAKE_TOKEN") or None,
            timeout,
            retries,
            backoff,
        )

    def headers(self) -> dict[str, str]:
        headers = {"User-Agent": "overtake-client", "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def url(self, path: str) -> str:
        return self.base_url + path

    def delay(self, attempt: int, response: httpx.Response | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based): exponential backoff, jittered between half
        and all of ``backoff * 2**attempt`` (so many clients do not retry in step), capped at ``max_backoff``;
        at least what a ``Retry-After`` header asks for, within the same cap."""
        ceiling = min(self.max_backoff, self.backoff * (2**attempt))
        wait = random.uniform(ceiling / 2, ceiling)
        if response is not None:
            wait = max(wait, min(self.max_backoff, _retry_after(response)))
        return wait


def _retry_after(response: httpx.Response) -> float:
    value = response.headers.get("Retry-After")
    if not value:
        return 0.0
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, when.timestamp() - time.time())


# Errors raised before any byte of the request left: repeating such a request is always safe.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# Errors of the network or of a server that went away; the request may or may not have been processed.
TRANSIENT = (httpx.NetworkError, httpx.TimeoutException, httpx.RemoteProtocolError)


def retryable_status(status: int) -> bool:
    return status == 429 or status >= 500


class Attempts:
    """The retry bookkeeping of one call: after each failure it says how long to wait, or raises the error to give.

    Idempotent calls are repeated on transient network errors, 5xx and 429. The others (triggers, savepoints,
    job creation, attempts) only when the request never left, so the coordinator cannot apply them twice.
    """

    def __init__(self, config: ClientConfig, call: Call[Any]) -> None:
        self.config = config
        self.call = call
        self.attempt = 0

    def after_error(self, exc: httpx.TransportError) -> float:
        safe = isinstance(exc, NOT_SENT) or (self.call.idempotent and isinstance(exc, TRANSIENT))
        if safe and self.attempt < self.config.retries:
            self.attempt += 1
            return self.config.delay(self.attempt - 1)
        raise unreachable(self.config, self.call, exc, self.attempt) from exc

    def after_response(self, response: httpx.Response) -> float:
        """For an error response (already read): the delay before the retry, or raises the coordinator's error."""
        if (
            self.call.idempotent
            and retryable_status(response.status_code)
            and self.attempt < self.config.retries
        ):
            self.attempt += 1
            return self.config.delay(self.attempt - 1, response)
        raise error_from_response(response)


def unreachable(config: ClientConfig, call: Call[Any] | None, exc: Exception, retried: int) -> OvertakeError:
    what = call.describe() if call is not None else "request"
    tries = f" after {retried + 1} tries" if retried else ""
    if call is not None and not call.idempotent and not isinstance(exc, NOT_SENT):
        return OutcomeUnknown(
            f"lost the connection to the coordinator at {config.base_url} during {what} ({type(exc).__name__}: "
            f"{exc or 'no detail'}); it may or may not have been applied: check before repeating it",
            config.base_url,
        )
    return CoordinatorUnreachable(
        f"cannot reach the coordinator at {config.base_url}{tries} ({what}: {type(exc).__name__}: "
        f"{exc or 'no detail'}); is it running at that address? (set it with --url or OVERTAKE_URL)",
        config.base_url,
    )


class EventStream:
    """The bookkeeping of a followed event stream: where to resume, when to reconnect, when to give up.

    A dropped connection or a 5xx is retried ``retries`` times in a row (the count restarts once a connection is
    open); a stream the server ends cleanly is reopened, unless it keeps ending without sending anything.
    """

    def __init__(self, config: ClientConfig, job_id: int, after: int | None, reconnect: bool) -> None:
        self.config = config
        self.path = f"{API}/jobs/{job_id}/events"
        self.last_id = after
        self.reconnect = reconnect
        self.failures = 0
        self.empty_closes = 0
        self.received = 0
        self.server_retry_ms: int | None = None
        self.is_open = False

    def connecting(self) -> dict[str, str]:
        """Called before each (re)connection; returns its headers."""
        self.is_open = False
        headers = self.config.headers() | {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if self.last_id is not None:
            headers["Last-Event-ID"] = str(self.last_id)
        return headers

    def timeout(self) -> httpx.Timeout:
        # an idle stream is normal; a read timeout only makes us reconnect (and so notices a dead connection)
        return httpx.Timeout(self.config.timeout, read=max(self.config.timeout, 60.0))

    def opened(self) -> None:
        self.is_open = True
        self.failures = 0
        self.received = 0

    def seen(self, event: Event, retry_ms: int | None) -> None:
        self.last_id = event.id
        self.received += 1
        self.empty_closes = 0
        if retry_ms is not None:
            self.server_retry_ms = retry_ms

    def after_error_response(self, response: httpx.Response) -> float:
        if self.reconnect and retryable_status(response.status_code) and self.failures < self.config.retries:
            self.failures += 1
            return self.config.delay(self.failures - 1, response)
        raise error_from_response(response)

    def after_error(self, exc: httpx.TransportError) -> float:
        if isinstance(exc, httpx.ReadTimeout) and self.is_open and self.reconnect:
            return 0.0  # a quiet stream, not a failure
        if self.reconnect and isinstance(exc, NOT_SENT + TRANSIENT) and self.failures < self.config.retries:
            self.failures += 1
            return self.config.delay(self.failures - 1)
        call = Call("GET", self.path, parse=lambda r: None)
        raise unreachable(self.config, call, exc, self.failures) from exc

    def after_close(self) -> float | None:
        """The server ended the stream: the delay before reopening it, or None to stop."""
        if not self.reconnect:
            return None
        if self.received == 0:
            self.empty_closes += 1
            if self.empty_closes > self.config.retries:
                return None
        if self.server_retry_ms is not None:
            return self.server_retry_ms / 1000
        return self.config.delay(self.empty_closes)
