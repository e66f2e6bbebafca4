"""Concurrent, duplicated and conflicting acks through the group commit: every subtask is counted exactly once."""

from __future__ import annotations

import asyncio
import random

import pytest
from sqlalchemy import func, select, text

from app.db.models import AckRow, CheckpointRow
from app.domain.context import lock_job, now_ms
from app.domain.lifecycle import AbortReason, abort_checkpoint


async def test_concurrent_duplicate_and_conflicting_acks_are_counted_once(api):
    n = 60
    job = await api.job(parallelism={"src": n})
    await api.trigger(job["id"])
    sends = [("src", i, 1) for i in range(n)]
    sends += [("src", i, 1) for i in range(40)]  # exact duplicates
    sends += [("src", i, 2) for i in range(50, 60)]  # a different ack for subtasks 50..59
    random.Random(3).shuffle(sends)

    async def send(vertex, index, variant):
        return await api.ack(job["id"], 1, vertex, index, metrics={"sync_duration": variant})

    responses = await asyncio.gather(*(send(*s) for s in sends))
    codes = [r.status_code for r in responses]
    assert codes.count(200) == 100 and codes.count(409) == 10
    assert sum(1 for r in responses if r.status_code == 200 and r.json()["duplicate"]) == 40
    detail = await api.checkpoint(job["id"], 1)
    assert detail["status"] == "COMPLETED" and detail["num_acknowledged_subtasks"] == n
    async with api.ctx.tx(readonly=True) as s:
        rows = (await s.execute(select(func.count()).select_from(AckRow).where(AckRow.job_id == job["id"]))).scalar_one()
    assert rows == n
    events = [e["type"] for e in await api.events(job["id"])]
    assert events.count("checkpoint.completed") == 1


async def test_malformed_acks_on_the_fast_path_get_the_error_shape(api):
    job = await api.job()
    await api.trigger(job["id"])
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/checkpoints/1/acks", content=b"{nope")
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid"
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/checkpoints/1/acks", json={"attempt": 1})
    assert r.status_code == 422 and "vertex" in r.json()["error"]["message"]
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/checkpoints/1/acks/batch", json={"acks": []})
    assert r.status_code == 422 and "acks" in r.json()["error"]["message"]
    r = await api.client.post("/api/v1/jobs/999/checkpoints/1/acks", json={"attempt": 1, "vertex": "src", "subtask_index": 0})
    assert r.status_code == 404
    assert (await api.checkpoint(job["id"], 1))["num_acknowledged_subtasks"] == 0


async def test_a_group_commit_locks_its_jobs_in_one_global_order(sqlite_api):
    """Two replicas' batches can then never wait for each other in a cycle (no deadlock)."""
    import asyncio

    from sqlalchemy import event

    from app.domain.acks import AckItem, ack_hash
    from contract.models import SubtaskAck

    jobs = [await sqlite_api.job() for _ in range(3)]
    for job in jobs:
        await sqlite_api.trigger(job["id"])
    locked: list[int] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("SELECT JOBS.CURRENT_ATTEMPT"):
            locked.append(parameters[-1] if isinstance(parameters, tuple) else parameters["b_job"])  # WHERE jobs.id = ?

    engine = sqlite_api.ctx.db.engine.sync_engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        loop = asyncio.get_running_loop()
        batch = []
        for job in reversed(jobs):  # arriving in the opposite order
            ack = SubtaskAck(attempt=1, vertex="src", subtask_index=0)
            batch.append(AckItem(job["id"], 1, ack, ack_hash(ack), None, loop.create_future()))
        await sqlite_api.app.state.committer._apply_retrying(batch)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert locked == sorted(j["id"] for j in jobs)


async def test_a_relays_batch_is_committed_without_waiting_for_more_acks_and_a_lone_ack_may_gather(api, monkeypatch):
    """Acks that came in one batch request were gathered where they came from (a host's relay): the committer
    starts their transaction at once. A lone ack lets acks already on their way join it first."""
    committer = api.app.state.committer
    gathered = []
    real = committer._gather

    async def gather():
        gathered.append(committer._queue.qsize())
        await real()

    monkeypatch.setattr(committer, "_gather", gather)
    job = await api.job(parallelism={"src": 3})
    await api.trigger(job["id"])
    acks = [{"attempt": 1, "vertex": "src", "subtask_index": i} for i in (0, 1)]
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/checkpoints/1/acks/batch", json={"acks": acks})
    assert r.status_code == 200 and all(item["ok"] for item in r.json()["items"])
    assert gathered == []
    assert (await api.ack(job["id"], 1, "src", 2)).status_code == 200
    assert len(gathered) == 1
    assert (await api.checkpoint(job["id"], 1))["status"] == "COMPLETED"


async def test_the_batch_that_completes_a_checkpoint_updates_its_row_once_with_every_sum(api):
    """The completing batch adds its sums to the checkpoint row it loads to complete it: one UPDATE of the row,
    not one for the sums and one for the completion. The sums are those of every ack, earlier batches' included."""
    from tests.coordinator._sql import recorded_statements

    job = await api.job(parallelism={"src": 3})
    await api.trigger(job["id"])
    first = {"unaligned": False, "alignment_duration": 40, "persisted_data": 100, "processed_data": 7}
    assert (await api.ack(job["id"], 1, "src", 0, metrics=first)).status_code == 200
    acks = [
        {"attempt": 1, "vertex": "src", "subtask_index": 1,
         "metrics": {"unaligned": True, "alignment_duration": 25, "persisted_data": 1000, "processed_data": 5}},
        {"attempt": 1, "vertex": "src", "subtask_index": 2,
         "metrics": {"unaligned": False, "alignment_duration": 60, "persisted_data": 10, "processed_data": 3}},
    ]
    with recorded_statements(api) as statements:
        r = await api.client.post(f"/api/v1/jobs/{job['id']}/checkpoints/1/acks/batch", json={"acks": acks})
    assert r.status_code == 200 and all(item["ok"] for item in r.json()["items"])
    assert [i["result"]["status"] for i in r.json()["items"]] == ["COMPLETED", "COMPLETED"]
    # on PostgreSQL the row's update is a clause of the statement that completes it with retention
    updates = [st for st in statements if "UPDATE CHECKPOINTS" in st and "NUM_ACKED" in st]
    assert len(updates) == 1 and "STATUS" in updates[0], updates
    cp = await api.checkpoint(job["id"], 1)
    assert cp["status"] == "COMPLETED" and cp["num_acknowledged_subtasks"] == 3
    assert cp["persisted_data"] == 1110 and cp["processed_data"] == 15
    assert cp["alignment_duration"] == 60
    assert cp["subtask_modes"] == {"unaligned": 1, "aligned": 2, "aligned_over_budget": 0}


async def test_a_batch_expected_to_complete_reads_the_rows_to_complete_with_its_locks(api):
    """Once the committer knows the job's size, a batch whose acks cover the subtasks still missing takes the job
    and checkpoint locks with the rows completing needs (one statement, no second read of them); the sums still
    count every ack, a duplicate in the batch included once, and a batch that leaves one missing does not
    complete."""
    from tests.coordinator._sql import recorded_statements

    job = await api.job(parallelism={"src": 3})
    url = f"/api/v1/jobs/{job['id']}/checkpoints/{{cp}}/acks/batch"

    def ack(i: int, persisted: int) -> dict:
        return {"attempt": 1, "vertex": "src", "subtask_index": i,
                "metrics": {"unaligned": True, "alignment_duration": 5 * i, "persisted_data": persisted}}

    await api.trigger(job["id"])
    r = await api.client.post(url.format(cp=1), json={"acks": [ack(i, 1) for i in range(3)]})
    assert [i["result"]["status"] for i in r.json()["items"]] == ["COMPLETED"] * 3

    await api.trigger(job["id"])
    assert (await api.ack(job["id"], 2, "src", 0, metrics=ack(0, 100)["metrics"])).status_code == 200
    with recorded_statements(api) as statements:
        r = await api.client.post(url.format(cp=2), json={"acks": [ack(0, 100), ack(1, 20), ack(2, 3)]})
    assert r.status_code == 200 and [i["result"]["duplicate"] for i in r.json()["items"]] == [True, False, False]
    # the job's rows read by id (the scheduler's passes read every running job meanwhile)
    reads = [st for st in statements if st.startswith("SELECT JOBS.") and "WHERE JOBS.ID =" in st]
    assert len(reads) == 1 and reads[0].startswith("SELECT JOBS.ID, JOBS.NAME"), reads
    if api.ctx.db.is_sqlite is False:
        assert reads[0].endswith("FOR UPDATE OF JOBS, CHECKPOINTS"), reads[0]
    cp = await api.checkpoint(job["id"], 2)
    assert cp["status"] == "COMPLETED" and cp["num_acknowledged_subtasks"] == 3
    assert cp["persisted_data"] == 123 and cp["alignment_duration"] == 10

    await api.trigger(job["id"])
    r = await api.client.post(url.format(cp=3), json={"acks": [ack(0, 1), ack(2, 1)]})
    assert [i["result"]["status"] for i in r.json()["items"]] == ["PENDING"] * 2
    assert (await api.ack(job["id"], 3, "src", 1)).json()["status"] == "COMPLETED"


@pytest.mark.postgres
async def test_an_ack_that_waited_for_the_job_lock_sees_the_abort_committed_meanwhile(make_api, pg_url):
    """Another transaction (a replica's scheduler expiring the checkpoint, a newer checkpoint completing, a new
    attempt) aborts a checkpoint while an ack for it waits for the job row lock: once the lock is granted the ack
    is decided on the checkpoint as that transaction left it, a 409 saying it was aborted, and nothing is recorded
    into the aborted checkpoint. Read as of the lock statement's start, it was still pending and the ack counted."""
    async with make_api(database_url=pg_url) as api:
        job = await api.job(parallelism={"src": 3})
        cp_id = (await api.trigger(job["id"])).json()["id"]
        assert (await api.ack(job["id"], cp_id, "src", 0)).status_code == 200

        async def lock_waits() -> int:
            async with api.ctx.tx(readonly=True) as s:
                return (await s.execute(text("SELECT count(*) FROM pg_locks WHERE NOT granted"))).scalar_one()

        async with api.ctx.tx() as s:  # what the other replica's transaction does, held open until the ack waits
            job_row = await lock_job(s, job["id"])
            cp = await s.get(CheckpointRow, (job["id"], cp_id))
            await abort_checkpoint(s, job_row, cp, AbortReason.expired, "by another replica", now_ms())
            waiting = asyncio.create_task(api.ack(job["id"], cp_id, "src", 1))
            await api.wait_for(lock_waits, what="the ack's transaction waiting for the job row lock")
        r = await asyncio.wait_for(waiting, 30)
        assert r.status_code == 409, r.text
        assert "aborted" in r.json()["error"]["message"]
        detail = await api.checkpoint(job["id"], cp_id)
        assert detail["status"] == "ABORTED"
        assert detail["num_acknowledged_subtasks"] == 1
        assert [(a["vertex"], a["subtask_index"]) for a in detail["subtasks"]] == [("src", 0)]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_an_ack_batch_runs_one_statement_per_step_that_writes_or_reads(make_api, request, backend):
    """The ack path's round trips, pinned: a pending checkpoint's ack is the locks with the checkpoint's facts,
    the ack rows and the sums (and the blob rows of a written object between them); on PostgreSQL the ack that
    completes the checkpoint is the locks with the rows completing needs, the ack rows and one statement for the
    completion with retention. (The job's first ack also reads its graph, cached for the attempt after.) A
    statement added to a step of the ack commit adds a round trip to every batch."""
    from tests.coordinator._sql import recorded_statements
    from tests.coordinator._state import target_of, write_object, written

    url = request.getfixturevalue("pg_url") if backend == "postgres" else None
    async with make_api(database_url=url, scheduler_enabled=False) as api:
        job = await api.job(parallelism={"src": 4})
        await api.trigger(job["id"])
        key = await write_object(await target_of(api, job["id"], 1), "src-2-a1.state", b"opchan")
        assert (await api.ack(job["id"], 1, "src", 3)).status_code == 200  # the job's graph, cached

        async def statements_of(*args, **extra) -> list[str]:
            with recorded_statements(api) as statements:
                r = await api.ack(job["id"], 1, "src", *args, **extra)
            assert r.status_code == 200, r.text
            return [" ".join(st.split()[:3]) for st in statements if not st.startswith("BEGIN")]

        assert await statements_of(0) == ["SELECT JOBS.CURRENT_ATTEMPT, JOBS.STATUS,", "INSERT INTO ACKS", "UPDATE CHECKPOINTS SET"]
        assert await statements_of(2, written=written(key, b"op", b"chan")) == [
            "SELECT JOBS.CURRENT_ATTEMPT, JOBS.STATUS,", "INSERT INTO ACKS", "INSERT INTO BLOBS", "UPDATE CHECKPOINTS SET"
        ]
        completing = await statements_of(1)
        assert completing[:2] == ["SELECT JOBS.ID, JOBS.NAME,", "INSERT INTO ACKS"], completing
        if backend == "postgres":
            assert len(completing) == 3 and completing[2].startswith("WITH"), completing
