"""The checkpoint history is bounded: checkpoints far enough behind a job's newest leave the database with their
acks once nothing needs them; what restore, savepoints, cleaning or references need stays."""

from __future__ import annotations

import pytest
from sqlalchemy import func, insert, select

from app.db.models import AckRow, ChannelStateRefRow, CheckpointRow
from app.domain import history

KEEP = 3


@pytest.fixture(params=["sqlite", "postgres"])
async def small_history(request, make_api):
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    async with make_api(database_url=url, checkpoint_history=KEEP, scheduler_enabled=False) as api:
        yield api


async def _complete(api, job: dict) -> int:
    cp = (await api.trigger(job["id"])).json()["id"]
    for r in await api.ack_all(job, cp):
        assert r.status_code == 200, r.text
    return cp


async def test_old_checkpoints_leave_the_database_with_their_acks_and_what_is_needed_stays(small_history):
    api = small_history
    ctx = api.app.state.ctx
    job = await api.job({"a": 2})  # keeps 1 completed checkpoint for restore (the default)
    jid = job["id"]
    first = await _complete(api, job)  # completed, then retired by the next
    savepoint = (await api.client.post(f"/api/v1/jobs/{jid}/savepoints", json={})).json()["id"]
    for r in await api.ack_all(job, savepoint):
        assert r.status_code == 200, r.text
    declined = (await api.trigger(jid)).json()["id"]
    r = await api.client.post(
        f"/api/v1/jobs/{jid}/checkpoints/{declined}/declines",
        json={"attempt": 1, "vertex": "a", "subtask_index": 0, "reason": "no"},
    )
    assert r.status_code == 200, r.text
    referenced, retired = await _complete(api, job), await _complete(api, job)
    recent = [await _complete(api, job) for _ in range(2)]
    pending = (await api.trigger(jid)).json()["id"]
    assert pending == 8  # ids 1..8: the newest KEEP (3) are recent[0], recent[1] and pending

    # a kept checkpoint's channel state references the objects of `referenced`
    async with ctx.tx() as s:
        await s.execute(insert(ChannelStateRefRow).values(
            job_id=jid, checkpoint_id=recent[-1], vertex="a", subtask_index=0,
            key=f"job-{jid}/cp-{referenced:012d}/a-0.state", ref_checkpoint_id=referenced,
        ))
    await ctx.sweep_state(now=2**53)  # every released prefix cleaned, the late writes' grace over
    await history.trim(ctx, KEEP)

    async with ctx.tx(readonly=True) as s:
        kept = set((await s.execute(select(CheckpointRow.id).where(CheckpointRow.job_id == jid))).scalars())
        acks = dict(
            (await s.execute(
                select(AckRow.checkpoint_id, func.count()).where(AckRow.job_id == jid).group_by(AckRow.checkpoint_id)
            )).all()
        )
    gone = {first, declined, retired}
    assert kept == {savepoint, referenced, *recent, pending}, kept
    assert not gone & set(acks) and acks[savepoint] == 2 and acks[recent[-1]] == 2
    assert (await api.client.get(f"/api/v1/jobs/{jid}/checkpoints/{first}")).status_code == 404
    assert len((await api.checkpoint(jid, savepoint))["subtasks"]) == 2

    # the latest completed checkpoint still restores; nothing more to trim
    plan = (await api.client.get(f"/api/v1/jobs/{jid}/restore-plan")).json()
    assert plan["checkpoint_id"] == recent[-1], plan
    assert await history.trim(ctx, KEEP) == 0
