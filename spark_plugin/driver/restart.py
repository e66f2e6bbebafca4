"""Restart strategies of the supervisor: how long to wait before restart ``k``, and when to give up.

    FixedDelay(max_restarts=3, delay=2.0)                  # Flink's fixed-delay strategy
    ExponentialBackoff(initial=0.5, max_delay=30, max_restarts=10)
    NoRestart()                                            # the first failure fails the job
"""

from __future__ import annotations

from dataclasses import dataclass


class RestartStrategy:
    """``delay_before(k)``: seconds to wait before the ``k``-th restart (1-based), or None to give up."""

    def delay_before(self, restart: int) -> float | None:
        raise NotImplementedError


@dataclass(frozen=True)
class NoRestart(RestartStrategy):
    """Never restart: a failed barrier stage fails the job."""

    def delay_before(self, restart: int) -> float | None:
        return None


@dataclass(frozen=True)
class FixedDelay(RestartStrategy):
    """Restart up to ``max_restarts`` times, waiting ``delay`` seconds before each restart."""

    max_restarts: int = 3
    delay: float = 1.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts {self.max_restarts} must not be negative")
        if self.delay < 0:
            raise ValueError(f"delay {self.delay} must not be negative (seconds)")

    def delay_before(self, restart: int) -> float | None:
        return self.delay if restart <= self.max_restarts else None


@dataclass(frozen=True)
class ExponentialBackoff(RestartStrategy):
    """Wait ``initial * multiplier**(k-1)`` seconds before restart ``k``, at most ``max_delay``.

    ``max_restarts`` bounds the number of restarts (None: restart for ever).
    """

    initial: float = 0.5
    max_delay: float = 30.0
    multiplier: float = 2.0
    max_restarts: int | None = 10

    def __post_init__(self) -> None:
        if self.initial < 0 or self.max_delay < 0:
            raise ValueError(f"initial {self.initial} and max_delay {self.max_delay} must not be negative (seconds)")
        if self.multiplier < 1:
            raise ValueError(f"multiplier {self.multiplier} must be at least 1")
        if self.max_restarts is not None and self.max_restarts < 0:
            raise ValueError(f"max_restarts {self.max_restarts} must not be negative (or None: no limit)")

    def delay_before(self, restart: int) -> float | None:
        if self.max_restarts is not None and restart > self.max_restarts:
            return None
        return min(self.initial * self.multiplier ** (restart - 1), self.max_delay)
