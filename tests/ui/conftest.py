"""Fixtures of the UI tests: one coordinator holding real checkpoints (seeded through the API) for the session."""

from __future__ import annotations

import pytest

from tests.ui.seed import Seeded, Seeder, seed


@pytest.fixture(scope="session")
def seeded(coordinator) -> Seeded:
    """'orders' with a dozen real checkpoints (aligned, unaligned with channel state, a savepoint, a declined one)
    and 'idle' with none."""
    return seed(coordinator.url)


@pytest.fixture(scope="session")
def long_history_job(coordinator, seeded) -> int:
    """A job with 1,000 completed checkpoints."""
    s = Seeder(coordinator.url)
    try:
        return s.long_history("long-history", 1000)
    finally:
        s.close()
