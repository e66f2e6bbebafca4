"""What the sync and async clients share below the endpoints: the description of one call, the retry policy,
the connection settings, and the bookkeeping of a resumable event stream.

Nothing here does I/O; ``client.sync`` and ``client.aio`` run these descriptions with httpx, and retry them with
tenacity by the policy of :class:`RetryPolicy`.
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
import tenacity

from client.errors import (
    CoordinatorUnreachable,
    OutcomeUnknown,
    OvertakeError,
    UnexpectedResponse,
    error_from_response,
)
from contract.models import Event

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
        max_backoff: float = 10.0,
    ) -> ClientConfig:
        url = (base_url or os.environ.get("OVERTAKE_URL") or DEFAULT_URL).rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"coordinator URL {url!r} must start with http:// or https://")
        try:
            host = httpx.URL(url).host
        except httpx.InvalidURL as exc:
            raise ValueError(f"coordinator URL {url!r} is not a valid URL ({exc})") from exc
        if not host:
            raise ValueError(f"coordinator URL {url!r} names no host, e.g. http://127.0.0.1:8321")
        if retries < 0 or backoff < 0 or max_backoff < 0:
            raise ValueError(
                f"retries ({retries}), backoff ({backoff}) and max_backoff ({max_backoff}) must not be negative"
            )
        token = token if token is not None else os.environ.get("OVERTAKE_TOKEN") or None
        if token:
            _check_token(token)
        return cls(url, token, timeout, retries, backoff, max_backoff)

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


def _check_token(token: str) -> None:
    """A token travels in an HTTP header: visible ASCII only. The error says where it is wrong, never the token."""
    for position, char in enumerate(token):
        if not "!" <= char <= "~":
            raise ValueError(
                f"the token has {'a space or control character' if char.isascii() else 'a non-ASCII character'} "
                f"at position {position + 1} of {len(token)}; a bearer token is visible ASCII only (check "
                "--token or OVERTAKE_TOKEN for a stray character)"
            )


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


class RetryPolicy:
    """Which failures of one call are tried again, and how long to wait, as a tenacity policy.

    Idempotent calls are repeated on transient network errors, 5xx and 429. The others (triggers, savepoints,
    job creation, attempts) only when the request never left, so the coordinator cannot apply them twice. Waits
    are ``ClientConfig.delay`` (jittered exponential backoff, at least what a ``Retry-After`` asks for). Once the
    retries are spent, or for a failure that is not retried, the call's error is raised: the coordinator's error for
    an answer, :class:`CoordinatorUnreachable` or :class:`OutcomeUnknown` for no answer.
    """

    def __init__(self, config: ClientConfig, call: Call[Any]) -> None:
        self.config = config
        self.call = call

    def should_retry(self, state: tenacity.RetryCallState) -> bool:
        outcome = state.outcome
        if outcome is None:  # pragma: no cover - tenacity always sets it before asking
            return False
        if outcome.failed:
            exc = outcome.exception()
            if not isinstance(exc, httpx.TransportError):
                return False
            return isinstance(exc, NOT_SENT) or (self.call.idempotent and isinstance(exc, TRANSIENT))
        response = outcome.result()
        return self.call.idempotent and not response.is_success and retryable_status(response.status_code)

    def wait(self, state: tenacity.RetryCallState) -> float:
        outcome = state.outcome
        response = None if outcome is None or outcome.failed else outcome.result()
        return self.config.delay(state.attempt_number - 1, response)

    def kwargs(self) -> dict[str, Any]:
        return {
            "retry": self.should_retry,
            "wait": self.wait,
            "stop": tenacity.stop_after_attempt(self.config.retries + 1),
            "retry_error_callback": lambda state: state.outcome.result(),  # the last answer, or its error
            "reraise": True,
        }

    def retrying(self, sleep: Callable[[float], None]) -> tenacity.Retrying:
        return tenacity.Retrying(sleep=sleep, **self.kwargs())

    def async_retrying(self, sleep: Callable[[float], Any]) -> tenacity.AsyncRetrying:
        return tenacity.AsyncRetrying(sleep=sleep, **self.kwargs())

    def answer(self, response: httpx.Response) -> Any:
        """The parsed answer of a success; raises the coordinator's error for any other answer."""
        if response.is_success:
            try:
                return self.call.parse(response)
            except ValueError as exc:  # not JSON, or JSON of another shape (pydantic's ValidationError too)
                raise unexpected(self.config, self.call.describe(), response, exc) from exc
        raise error_from_response(response)

    def failed(self, exc: httpx.TransportError, tries: int) -> OvertakeError:
        return unreachable(self.config, self.call, exc, tries - 1)


def unexpected(config: ClientConfig, what: str, response: httpx.Response, exc: ValueError) -> UnexpectedResponse:
    """The error for a success answer that is not the API's: what came, and what to check."""
    kind = response.headers.get("content-type") or "no content type"
    body = repr(response.text.strip()[:120]) if response.content else "an empty body"
    reason = str(exc).splitlines()[0][:200]
    return UnexpectedResponse(
        response.status_code,
        "unexpected_response",
        f"the server at {config.base_url} answered {what} with HTTP {response.status_code} ({kind}) that is not the "
        f"coordinator's API ({reason}): {body}; is {config.base_url} an Overtake coordinator of this version? "
        "(set the address with --url or OVERTAKE_URL)",
    )


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
    With ``max_reconnect_time`` (seconds; ``math.inf`` to follow for as long as the caller iterates) it is retried
    instead until the stream has been down for that long without a break, with backoff capped at
    ``max_backoff``. Every reconnection resumes after the last event seen, and an event seen before is never
    passed on again, so no event is lost or repeated. A 4xx (the job is gone, the token ended) always ends it.
    """

    def __init__(
        self,
        config: ClientConfig,
        job_id: int,
        after: int | None,
        reconnect: bool,
        max_reconnect_time: float | None = None,
    ) -> None:
        if max_reconnect_time is not None and not max_reconnect_time >= 0:
            raise ValueError(f"max_reconnect_time must be a number of seconds >= 0, got {max_reconnect_time!r}")
        self.config = config
        self.path = f"{API}/jobs/{job_id}/events"
        self.last_id = after
        self.reconnect = reconnect
        self.max_reconnect_time = max_reconnect_time
        self.failures = 0
        self.empty_closes = 0
        self.received = 0
        self.server_retry_ms: int | None = None
        self.is_open = False
        self.down_since: float | None = None

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
        self.down_since = None

    def parse(self, data: str) -> Event:
        """The event in one message's ``data``; :class:`UnexpectedResponse` when it is not one."""
        try:
            return Event.model_validate_json(data)
        except ValueError as exc:
            reason = str(exc).splitlines()[0][:200]
            raise UnexpectedResponse(
                200,
                "unexpected_response",
                f"the event stream of {self.config.base_url}{self.path} sent a message that is not an event "
                f"({reason}): {data[:120]!r}; is {self.config.base_url} an Overtake coordinator of this version?",
            ) from exc

    def seen(self, event: Event, retry_ms: int | None) -> bool:
        """Record an event; False when it was passed on before (a server replaying it after a reconnect)."""
        if retry_ms is not None:
            self.server_retry_ms = retry_ms
        if self.last_id is not None and event.id <= self.last_id:
            return False
        self.last_id = event.id
        self.received += 1
        self.empty_closes = 0
        return True

    def _may_retry(self) -> bool:
        if not self.reconnect:
            return False
        if self.max_reconnect_time is None:
            return self.failures < self.config.retries
        if self.down_since is None:
            self.down_since = time.monotonic()
        return time.monotonic() - self.down_since < self.max_reconnect_time

    def _backoff(self) -> int:
        return min(self.failures, 30)  # the delay is capped anyway; keep the exponent small

    def after_error_response(self, response: httpx.Response) -> float:
        if retryable_status(response.status_code) and self._may_retry():
            self.failures += 1
            return self.config.delay(self._backoff() - 1, response)
        raise error_from_response(response)

    def after_error(self, exc: httpx.TransportError) -> float:
        if isinstance(exc, httpx.ReadTimeout) and self.is_open and self.reconnect:
            return 0.0  # a quiet stream, not a failure
        if isinstance(exc, NOT_SENT + TRANSIENT) and self._may_retry():
            self.failures += 1
            return self.config.delay(self._backoff() - 1)
        call = Call("GET", self.path, parse=lambda r: None)
        raise unreachable(self.config, call, exc, self.failures) from exc

    def after_close(self) -> float | None:
        """The server ended the stream: the delay before reopening it, or None to stop."""
        if not self.reconnect:
            return None
        if self.received == 0:
            self.empty_closes += 1
            if self.max_reconnect_time is None and self.empty_closes > self.config.retries:
                return None
        if self.server_retry_ms is not None:
            return self.server_retry_ms / 1000
        return self.config.delay(min(self.empty_closes, 30))
