"""A subtask's live metrics: records/s, bytes/s and backpressure over its last few seconds, its current watermark with
its lag behind the wall clock, and a source's splits with their positions and lag, sent to the coordinator off the
subtask loop.

The loop calls :meth:`LiveMetrics.tick` on every turn (it returns at once unless a second has passed) and
:meth:`LiveMetrics.blocked` with the time it waited for room in its outputs. A sample is handed to a background
thread through a one-slot mailbox (a newer sample replaces one not yet sent), so the loop never waits for the
coordinator; a coordinator that is down or refuses a report costs a log line at debug level, and the next sample is
sent a second later.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from contract.models import MAX_FIGURE

log = logging.getLogger("overtake.subtask")

INTERVAL = 1.0
"""Seconds between two samples."""

SMOOTHING = 5.0
"""Seconds the rates and backpressure of a sample cover (``window_ms`` says so): the last few samples' span, not
one interval's. Under backpressure a subtask moves records in bursts as credit arrives, so one second's count
swings between nothing and a burst; over several seconds it is the rate the pipeline sustains."""

Send = Callable[[dict[str, Any], int], None]
"""Sends one sample (the ``metrics`` of a ``SubtaskMetricsReport``) measured at a time in ms since the epoch."""

WatermarkNow = Callable[[], tuple[int | None, bool]]
"""The subtask's current watermark (epoch ms, None without one) and whether it is idle."""

MAX_SPLITS = 100
"""A source subtask reports at most this many of its splits per sample (``splits_more`` counts the rest)."""

SplitsNow = Callable[[int], dict[str, Any]]
"""A source's splits for a sample, at most the number given: ``Source.split_metrics``."""


class LiveMetrics:
    """Turns the loop's counters into rates over the last ``smoothing`` seconds, once per ``interval``; a no-op
    without ``send``."""

    def __init__(
        self,
        send: Send | None,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        watermark: WatermarkNow | None = None,
        smoothing: float = SMOOTHING,
        splits: SplitsNow | None = None,
    ):
        self.interval = interval
        self.clock = clock
        self.watermark = watermark
        self.splits = splits
        self.recovery: Callable[[], dict[str, Any]] | None = None
        """A restored subtask's recovery so far (``RecoveryProgress.sample``), sent with every sample."""
        self.blocked_s = 0.0
        """Seconds the loop waited for room in its outputs, in all."""
        self._sender = MetricsSender(send) if send is not None else None
        self.smoothing = max(smoothing, interval)
        start = clock()
        self._points: deque[tuple[float, int, int, int, float]] = deque([(start, 0, 0, 0, 0.0)])
        """(time, records in, bytes in, bytes out, seconds blocked) at the samples of the last ``smoothing``."""
        self._next = start + interval

    def blocked(self, seconds: float) -> None:
        """The loop waited ``seconds`` because no output had room (backpressure)."""
        self.blocked_s += seconds

    def tick(self, records_in: int, bytes_in: int, bytes_out: int, force: bool = False) -> None:
        """Take a sample once an interval passed since the last one (``force``: now)."""
        now = self.clock()
        if (now < self._next and not force) or self._sender is None:
            return
        points = self._points
        while len(points) > 1 and points[1][0] <= now - self.smoothing:
            points.popleft()  # the newest point at or before the window's start stays its base
        t0, records0, bytes_in0, bytes_out0, blocked0 = points[0]
        window = max(now - t0, 1e-6)
        sample = {
            "window_ms": max(1, round(window * 1000)),
            "records_in_per_second": (records_in - records0) / window,
            "bytes_in_per_second": (bytes_in - bytes_in0) / window,
            "bytes_out_per_second": (bytes_out - bytes_out0) / window,
            "backpressure": min(1.0, max(0.0, (self.blocked_s - blocked0) / window)),
            "records_in": records_in,
            "bytes_in": bytes_in,
            "bytes_out": bytes_out,
        }
        points.append((now, records_in, bytes_in, bytes_out, self.blocked_s))
        self._next = now + self.interval
        timestamp = int(time.time() * 1000)
        if self.watermark is not None:
            sample.update(watermark_sample(*self.watermark(), timestamp))
        if self.recovery is not None:
            sample["recovery"] = self.recovery()
        if self.splits is not None:
            try:
                sample.update(self.splits(MAX_SPLITS))
            except Exception as e:  # noqa: BLE001 - a source's lag() is never worth failing the subtask
                log.debug("split metrics left out (%s: %s)", type(e).__name__, e)
        self._sender.offer(sample, timestamp)

    def close(self, timeout: float = 1.0) -> None:
        if self._sender is not None:
            self._sender.close(timeout)


def watermark_sample(watermark: int | None, idle: bool, timestamp: int) -> dict[str, Any]:
    """The watermark fields of a sample measured at ``timestamp``: none without a watermark, or with one outside
    what the coordinator takes (the end of event time, ``MAX_WATERMARK``, is no time to show a lag against)."""
    if watermark is None or not -MAX_FIGURE <= watermark <= MAX_FIGURE:
        return {}
    return {"watermark": watermark, "watermark_lag_ms": timestamp - watermark, "watermark_idle": idle}


class MetricsSender:
    """Sends the newest sample on a daemon thread; drops what it cannot send."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.sent = 0
        self.failed = 0
        self._slot: tuple[dict[str, Any], int] | None = None
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="metrics-sender", daemon=True)
        self._thread.start()

    def offer(self, sample: dict[str, Any], timestamp: int) -> None:
        with self._cv:
            self._slot = (sample, timestamp)
            self._cv.notify()

    def close(self, timeout: float = 1.0) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._slot is None and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                sample, timestamp = self._slot
                self._slot = None
            try:
                self.send(sample, timestamp)
                self.sent += 1
            except Exception as e:  # noqa: BLE001 - a metrics report is never worth failing the subtask
                self.failed += 1
                log.debug("live metrics not sent (%s: %s)", type(e).__name__, e)
