"""The services the coordinator stands on go away and come back (PostgreSQL here, behind a proxy the test takes
down: connections refused, open ones cut). Requests meanwhile get a 503 with Retry-After, never a 500 or a hang; once
the service is back the coordinator serves again by itself, and nothing answered 200 is lost or counted twice."""

from __future__ import annotations

import pytest

from tests.coordinator._outage import outage_proxy
from tests.coordinator.conftest import _serve, _settings

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
async def pg_outage(pg_url):
    """A proxy in front of this test's PostgreSQL database, which the test takes down and brings up."""
    async with outage_proxy(pg_url, 5432) as proxy:
        yield proxy


@pytest.fixture
async def pg_api(tmp_path, pg_url, pg_outage):
    """The coordinator on PostgreSQL, reached through `pg_outage`."""
    async for a in _serve(_settings(tmp_path, pg_outage.url(pg_url)), "postgres"):
        yield a


async def test_an_ack_while_the_database_is_away_is_answered_503_with_retry_after(pg_api, pg_outage):
    job = await pg_api.job()
    cp = (await pg_api.trigger(job["id"])).json()["id"]
    await pg_outage.down()
    r = await pg_api.ack(job["id"], cp, "src", 0)
    assert r.status_code == 503 and r.headers.get("retry-after"), (r.status_code, dict(r.headers), r.text)
    assert r.json()["error"]["code"] == "unavailable"
    await pg_outage.up()
    again = await pg_api.ack(job["id"], cp, "src", 0)
    assert again.status_code == 200 and again.json()["num_acknowledged_subtasks"] == 1, again.text
