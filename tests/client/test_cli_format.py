"""Units the command line shows to people."""

import pytest

from cli.format import duration, human_bytes


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "-"),
        (0, "0 B"),
        (1023, "1,023 B"),
        (1536, "1.5 KiB"),
        (5 * 1024**2, "5.0 MiB"),
        (3 * 1024**4, "3.0 TiB"),
    ],
)
def test_sizes_are_binary_units(value, shown):
    assert human_bytes(value) == shown


@pytest.mark.parametrize(
    ("ms", "shown"),
    [(None, "-"), (0, "0 ms"), (850, "850 ms"), (2350, "2.35 s"), (185_000, "3m 05s"), (3_720_000, "1h 02m")],
)
def test_durations_pick_a_readable_unit(ms, shown):
    assert duration(ms) == shown
