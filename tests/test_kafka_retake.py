"""The whole-test retake of Kafka tests (``tests/kafka.py``): only Tansu's race is taken again, and only so often."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.kafka import HELD_BACK_MARKER, retake_kafka_test, retaken_past_tansus_race


def item(fn, kafka: bool = True):
    return SimpleNamespace(
        obj=fn, funcargs={"x": 1}, _fixtureinfo=SimpleNamespace(argnames=("x",)), nodeid="t",
        get_closest_marker=lambda name: object() if kafka and name == "kafka" else None,
    )


def failing(times: int, message: str):
    calls = []

    def fn(x):
        calls.append(x)
        if len(calls) <= times:
            raise RuntimeError(message)

    return fn, calls


def test_a_kafka_test_that_met_the_race_is_taken_again_with_its_fixtures():
    fn, calls = failing(1, f"the transaction ... its {HELD_BACK_MARKER} 1 30 s later")
    with pytest.warns(UserWarning, match="retaking the test"):
        assert retake_kafka_test(item(fn)) is True
    assert calls == [1, 1]


def test_any_other_failure_and_the_race_on_the_last_try_fail_the_test():
    fn, calls = failing(1, "3 duplicates, 0 missing")
    with pytest.raises(RuntimeError, match="duplicates"):
        retake_kafka_test(item(fn))
    assert calls == [1]
    fn, calls = failing(5, HELD_BACK_MARKER)
    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match=HELD_BACK_MARKER):
        retake_kafka_test(item(fn), tries=3)
    assert len(calls) == 3


def test_tests_without_the_kafka_marker_and_tests_that_retake_by_themselves_are_not_taken_again():
    fn, calls = failing(1, HELD_BACK_MARKER)
    assert retake_kafka_test(item(fn, kafka=False)) is False
    assert calls == []

    def inner():
        raise RuntimeError(HELD_BACK_MARKER)

    def test_body(x):
        calls.append(x)
        retaken_past_tansus_race(inner, "inner", tries=1)

    with pytest.raises(RuntimeError):
        retake_kafka_test(item(test_body))
    assert calls == [1]
