"""Restart strategies: how long the supervisor waits before each restart and when it gives up."""

from __future__ import annotations

import pytest

from spark_plugin.driver.restart import ExponentialBackoff, FixedDelay, NoRestart


def test_fixed_delay_waits_the_same_before_each_restart_up_to_the_maximum():
    s = FixedDelay(max_restarts=3, delay=1.5)
    assert [s.delay_before(k) for k in range(1, 5)] == [1.5, 1.5, 1.5, None]


def test_exponential_backoff_doubles_up_to_the_cap_and_gives_up_after_the_maximum():
    s = ExponentialBackoff(initial=0.5, max_delay=3.0, multiplier=2.0, max_restarts=5)
    assert [s.delay_before(k) for k in range(1, 7)] == [0.5, 1.0, 2.0, 3.0, 3.0, None]


def test_exponential_backoff_without_a_maximum_restarts_for_ever():
    assert ExponentialBackoff(initial=1, max_delay=60, max_restarts=None).delay_before(1000) == 60


def test_no_restart_gives_up_at_once():
    assert NoRestart().delay_before(1) is None


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: FixedDelay(max_restarts=-1), "max_restarts -1 must not be negative"),
        (lambda: FixedDelay(delay=-2), "delay -2 must not be negative"),
        (lambda: ExponentialBackoff(multiplier=0.5), "multiplier 0.5 must be at least 1"),
    ],
)
def test_invalid_strategies_are_refused_with_the_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()
