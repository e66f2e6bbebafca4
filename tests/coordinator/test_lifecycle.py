"""The checkpoint lifecycle (ARCHITECTURE.md protocol steps 1, 5, 6): ids, limits, acks, completion,
subsumption, retention, timeouts, declines and failure counting."""

from __future__ import annotations

import json
import os

from sqlalchemy import event

from app.blobstore import upload_key


async def test_ids_increase_per_job_and_are_never_reused(api):
    a = await api.job()
    b = await api.job()
    ids = []
    for _ in range(3):
        cp = (await api.trigger(a["id"])).json()
        ids.append(cp["id"])
        await api.client.post(
            f"/api/v1/jobs/{a['id']}/checkpoints/{cp['id']}/declines",
            json={"attempt": 1, "vertex": "src", "subtask_index": 0, "reason": "test"},
        )
    assert ids == [1, 2, 3]
    assert (await api.trigger(b["id"])).json()["id"] == 1  # per-job counter
    await api.client.post(f"/api/v1/jobs/{a['id']}/attempts", json={})
    assert (await api.trigger(a["id"])).json()["id"] == 4  # a new attempt does not reset ids


async def test_a_trigger_writes_its_checkpoint_event_and_job_counters_in_one_statement_on_postgresql(api):
    """Each round trip of the trigger's transaction lies between the trigger timestamp and the subtasks' barriers:
    on PostgreSQL the new checkpoint, its event and the job's counters are one statement. What it writes is what
    the ORM writes on SQLite: the checkpoint as the API shows it, its event numbered next, the job's next id."""
    from tests.coordinator._sql import recorded_statements

    job = await api.job()
    for cp_id in (1, 2):
        with recorded_statements(api) as statements:
            r = await api.trigger(job["id"])
        assert r.status_code == 201, r.text
        created = r.json()
        assert created["id"] == cp_id and created["status"] == "PENDING"
        if not api.ctx.db.is_sqlite:
            writes = [st for st in statements if st.startswith(("INSERT", "UPDATE JOBS", "WITH NEW_CHECKPOINT"))]
            assert len(writes) == 1 and writes[0].startswith("WITH NEW_CHECKPOINT AS (INSERT INTO CHECKPOINTS"), writes
        shown = await api.checkpoint(job["id"], cp_id)
        assert {k: shown[k] for k in created} == created
        await api.ack_all(job, cp_id)
    events = await api.events(job["id"])
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))
    triggered = [e for e in events if e["type"] == "checkpoint.triggered"]
    assert [e["data"]["checkpoint_id"] for e in triggered] == [1, 2]
    assert triggered[1]["timestamp"] == (await api.checkpoint(job["id"], 2))["trigger_timestamp"]
    assert (await api.trigger(job["id"])).json()["id"] == 3
    if not api.ctx.db.is_sqlite:
        from sqlalchemy import text

        from app.domain.checkpoints import _TRIGGER_STATEMENTS

        assert len(_TRIGGER_STATEMENTS) == 1  # built once, bound anew for each trigger
        # a column left None is SQL NULL, as the ORM writes it, not a JSON null
        async with api.ctx.db.session() as s:
            nulls = (await s.execute(text(
                "SELECT count(*) FROM checkpoints WHERE job_id = :j AND decision IS NULL AND details IS NULL"
            ), {"j": job["id"]})).scalar()
        assert nulls == 3


async def test_completing_writes_checkpoint_event_job_and_retention_in_one_statement_on_postgresql(api):
    """The transaction of the last ack completes the checkpoint: on PostgreSQL its row, its `checkpoint.completed`
    event, the job's row and retention (which counts the checkpoint completing in the same statement as completed)
    are one statement, not four. What it writes is what the ORM's flush writes on SQLite: the checkpoint as the API
    shows it, its event numbered next with the checkpoint's numbers, the job's latest completed checkpoint, and the
    checkpoints beyond `retained` discarded, never the one just completed."""
    from tests.coordinator._sql import recorded_statements

    job = await api.job(retained=2)
    jid = job["id"]
    for cp_id in (1, 2, 3, 4):
        assert (await api.trigger(jid)).status_code == 201
        with recorded_statements(api) as statements:
            answers = await api.ack_all(job, cp_id)
        assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
        assert answers[-1].json()["status"] == "COMPLETED"
        if not api.ctx.db.is_sqlite:
            # every statement that writes the job or an event, or sets a checkpoint's status
            writes = [st for st in statements if "INSERT INTO EVENTS" in st or "UPDATE JOBS" in st
                      or "UPDATE CHECKPOINTS SET STATUS" in st]
            assert len(writes) == 1, writes
            assert writes[0].startswith("WITH DISCARDED AS (UPDATE CHECKPOINTS SET DISCARDED"), writes[0]
            for clause in ("COMPLETED AS (UPDATE CHECKPOINTS SET", "COMPLETED_EVENT AS (INSERT INTO EVENTS",
                           "COMPLETED_JOB AS (UPDATE JOBS SET"):
                assert clause in writes[0], clause
        shown = await api.checkpoint(jid, cp_id)
        assert shown["status"] == "COMPLETED" and shown["discarded"] is False
        assert shown["num_acknowledged_subtasks"] == shown["num_subtasks"] == len(answers)
        events = await api.events(jid)
        assert [e["id"] for e in events] == list(range(1, len(events) + 1))
        last = events[-1]
        assert last["type"] == "checkpoint.completed" and last["data"]["checkpoint_id"] == cp_id
        assert last["timestamp"] == shown["completed_timestamp"]
        assert last["data"]["end_to_end_duration"] == shown["completed_timestamp"] - shown["trigger_timestamp"]
        r = await api.client.get(f"/api/v1/jobs/{jid}")
        assert r.json()["latest_completed_checkpoint_id"] == cp_id
        assert r.json()["latest_completed_at"] == shown["completed_timestamp"]
        # retained=2: the two newest completed checkpoints are kept, the older ones discarded
        for older in range(1, cp_id + 1):
            assert (await api.checkpoint(jid, older))["discarded"] is (older <= cp_id - 2), (cp_id, older)
    assert (await api.trigger(jid)).json()["id"] == 5


async def test_retention_and_the_pending_read_each_checkpoint_once_whatever_plan_the_database_chooses(api):
    """Every completion runs retention over the job's checkpoints, and a job keeps up to `checkpoint_history` of
    them. Retention must cost each of them one read, not one per checkpoint: with `id IN (the candidates newest
    first, OFFSET retained)` PostgreSQL, on a young table's statistics, ran that subquery again for every row of the
    job (a nested loop), and each completion cost the square of the history (17 ms at 280 checkpoints, the periodic
    triggers 2.5 times their interval). Here joins that hash, merge or materialize are switched off, so a statement
    that lets a plan run a subquery per row shows it; and sequential scans, so the index retention reads shows
    whether it holds the discarded history too. A trigger's read of the job's pending checkpoints is held to the
    same. On SQLite, what retention keeps is checked."""
    from app.domain import completion
    from app.domain.checkpoints import PENDING_IDS

    job = await api.job(retained=3)
    jid, n = job["id"], 40
    for cp_id in range(1, n + 1):
        assert (await api.trigger(jid)).status_code == 201
        assert all(r.status_code == 200 for r in await api.ack_all(job, cp_id))
    kept = [cp_id for cp_id in range(1, n + 1) if not (await api.checkpoint(jid, cp_id))["discarded"]]
    assert kept == [n - 2, n - 1, n]
    if api.ctx.db.is_sqlite:
        return
    params = {"r_job": jid, "r_oldest_kept": 2, "r_latest": n, "r_now": 0, "r_completing": n + 1, "job_id": jid}
    # and a trigger's read of the job's pending checkpoints, which reads the same index
    for statement in (completion._DISCARD_BEYOND_RETAINED, completion._COMPLETING_DISCARD_AND_RELEASE, PENDING_IDS):
        async with api.ctx.db.session() as s:
            conn = await s.connection()
            for setting in ("enable_hashjoin", "enable_mergejoin", "enable_material", "enable_seqscan"):
                await conn.exec_driver_sql(f"SET LOCAL {setting} = off")
            compiled = statement.compile(dialect=conn.dialect)
            values = compiled.construct_params(params)
            args = tuple(values[name] for name in compiled.positiontup)
            plan = (await conn.exec_driver_sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {compiled}", args)).scalar()
            await s.rollback()  # ANALYZE ran the statement
        if isinstance(plan, str):
            plan = json.loads(plan)
        scans = [node for node in _plan_nodes(plan[0]["Plan"]) if node.get("Relation Name") == "checkpoints"]
        assert scans, plan
        assert all(node["Actual Loops"] == 1 for node in scans), [
            (node["Node Type"], node["Actual Loops"], node.get("Filter")) for node in scans
        ]
        # and with an index of the checkpoints not discarded, not the discarded history (37 of the job's 40)
        removed = sum(node.get("Rows Removed by Filter", 0) for node in scans)
        assert removed < 10, [(node["Node Type"], node.get("Index Name"), node.get("Rows Removed by Filter"))
                              for node in scans]


def _plan_nodes(node: dict):
    yield node
    for child in node.get("Plans", ()):
        yield from _plan_nodes(child)


async def test_ids_continue_after_a_coordinator_restart(make_api, request):
    url = None
    if os.environ.get("OVERTAKE_TEST_ALSO_PG", "1") == "1":
        url = request.getfixturevalue("pg_url")
    async with make_api(database_url=url) as api:
        job = await api.job()
        await api.trigger(job["id"])
        await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={})
    async with make_api(database_url=url) as api:
        assert (await api.trigger(job["id"])).json()["id"] == 2


async def test_max_concurrent_refuses_a_manual_trigger_with_409_that_says_why(api):
    job = await api.job(max_concurrent=2)
    assert (await api.trigger(job["id"])).status_code == 201
    assert (await api.trigger(job["id"])).status_code == 201
    r = await api.trigger(job["id"])
    assert r.status_code == 409
    assert "max_concurrent=2" in r.json()["error"]["message"] and "[1, 2]" in r.json()["error"]["message"]


async def test_min_pause_refuses_a_trigger_too_soon_after_completion(api):
    job = await api.job(min_pause=60_000)
    await api.trigger(job["id"])
    await api.ack_all(job, 1)
    r = await api.trigger(job["id"])
    assert r.status_code == 409
    assert "min_pause=60000" in r.json()["error"]["message"]


async def test_trigger_before_an_attempt_is_refused(api):
    job = await api.job(start=False)
    r = await api.trigger(job["id"])
    assert r.status_code == 409 and "start one" in r.json()["error"]["message"]


async def test_checkpoint_completes_only_with_the_last_ack_and_publishes_completed(api):
    job = await api.job()
    cp = (await api.trigger(job["id"], policy="unaligned")).json()
    assert cp["policy"] == "unaligned"
    results = await api.ack_all(job, cp["id"], skip={("agg", 1)})
    assert all(r.json()["status"] == "PENDING" for r in results)
    assert (await api.checkpoint(job["id"], cp["id"]))["pending_subtasks"] == ["agg[1]"]
    last = await api.ack(job["id"], cp["id"], "agg", 1, metrics={"unaligned": True, "persisted_data": 7})
    assert last.json()["status"] == "COMPLETED"
    detail = await api.checkpoint(job["id"], cp["id"])
    assert detail["status"] == "COMPLETED"
    assert detail["num_acknowledged_subtasks"] == detail["num_subtasks"] == 4
    assert detail["checkpoint_type"] == "unaligned" and detail["persisted_data"] == 7
    types = [e["type"] for e in await api.events(job["id"])]
    assert types == ["attempt.started", "checkpoint.triggered", "checkpoint.completed"]


async def test_the_same_ack_again_succeeds_and_changes_nothing(api):
    job = await api.job()
    await api.trigger(job["id"])
    first = await api.ack(job["id"], 1, "src", 0, metrics={"sync_duration": 3})
    again = await api.ack(job["id"], 1, "src", 0, metrics={"sync_duration": 3})
    assert first.status_code == again.status_code == 200
    assert again.json()["duplicate"] is True
    assert again.json()["num_acknowledged_subtasks"] == 1


async def test_a_different_ack_for_the_same_subtask_is_409(api):
    job = await api.job()
    await api.trigger(job["id"])
    await api.ack(job["id"], 1, "src", 0, metrics={"sync_duration": 3})
    r = await api.ack(job["id"], 1, "src", 0, metrics={"sync_duration": 4})
    assert r.status_code == 409 and "different content" in r.json()["error"]["message"]
    assert (await api.checkpoint(job["id"], 1))["num_acknowledged_subtasks"] == 1


async def test_ack_refusals_name_what_is_unknown(api):
    job = await api.job()
    await api.trigger(job["id"])
    r = await api.ack(job["id"], 9, "src", 0)
    assert r.status_code == 404 and "no checkpoint 9" in r.json()["error"]["message"]
    r = await api.ack(job["id"], 1, "nope", 0)
    assert r.status_code == 404 and "no vertex 'nope'" in r.json()["error"]["message"]
    r = await api.ack(job["id"], 1, "src", 5)
    assert r.status_code == 404 and "parallelism 2" in r.json()["error"]["message"]
    r = await api.ack(job["id"], 1, "src", 0, attempt=7)
    assert r.status_code == 409 and "attempt 1" in r.json()["error"]["message"]
    r = await api.ack(job["id"], 1, "src", -1)
    assert r.status_code == 422
    assert (await api.checkpoint(job["id"], 1))["num_acknowledged_subtasks"] == 0


async def test_batch_ack_reports_each_item_and_completes(api):
    job = await api.job()
    await api.trigger(job["id"])
    acks = [{"attempt": 1, "vertex": v, "subtask_index": i} for v in ("src", "agg") for i in range(2)]
    acks.append({"attempt": 1, "vertex": "ghost", "subtask_index": 0})
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/checkpoints/1/acks/batch", json={"acks": acks})
    items = r.json()["items"]
    assert [i["status_code"] for i in items] == [200, 200, 200, 200, 404]
    assert items[3]["result"]["status"] == "COMPLETED"


async def test_completion_subsumes_older_pending_checkpoints_but_not_savepoints(api):
    job = await api.job(max_concurrent=3)
    await api.trigger(job["id"])  # 1
    sp = (await api.client.post(f"/api/v1/jobs/{job['id']}/savepoints", json={})).json()  # 2
    await api.trigger(job["id"])  # 3
    await api.ack_all(job, 3)
    assert (await api.checkpoint(job["id"], 1))["failure_reason"] == "subsumed: checkpoint 3 completed"
    assert (await api.checkpoint(job["id"], sp["id"]))["status"] == "PENDING"
    await api.ack_all(job, sp["id"])
    assert (await api.checkpoint(job["id"], sp["id"]))["status"] == "COMPLETED"


async def test_the_ack_completing_a_checkpoint_subsumes_and_discards_without_looking_up_references(api):
    """A job whose channel state references nothing: the completing ack's transaction subsumes the older pending
    checkpoint and discards the one beyond `retained`, and reads the references once (whether the job has any)."""
    job = await api.job(retained=1, max_concurrent=2)
    await api.trigger(job["id"])  # 1
    await api.ack_all(job, 1)
    await api.trigger(job["id"])  # 2, subsumed by 3
    await api.trigger(job["id"])  # 3
    statements: list[str] = []

    def seen(conn, cursor, statement, parameters, context, executemany):
        statements.append(statement)

    engine = api.ctx.db.engine.sync_engine
    event.listen(engine, "before_cursor_execute", seen)
    try:
        acks = [{"attempt": 1, "vertex": v, "subtask_index": i} for v in ("src", "agg") for i in range(2)]
        r = await api.client.post(f"/api/v1/jobs/{job['id']}/checkpoints/3/acks/batch", json={"acks": acks})
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert r.status_code == 200, r.text
    assert r.json()["items"][-1]["result"]["status"] == "COMPLETED"
    assert (await api.checkpoint(job["id"], 2))["failure_reason"] == "subsumed: checkpoint 3 completed"
    first = await api.checkpoint(job["id"], 1)
    assert first["status"] == "COMPLETED" and first["discarded"] is True
    assert (await api.checkpoint(job["id"], 3))["discarded"] is False
    assert [s for s in statements if "channel_state_refs" in s] == [
        s for s in statements if "channel_state_refs" in s and "EXISTS" in s
    ]
    assert len([s for s in statements if "channel_state_refs" in s]) == 1
    types = [e["type"] for e in await api.events(job["id"])]
    assert types[-2:] == ["checkpoint.completed", "checkpoint.aborted"]


async def test_the_trigger_carries_each_subtasks_share_of_the_inflight_budget_and_what_to_do_over_it(api):
    job = await api.job(policy="unaligned", max_inflight_bytes=4096, max_inflight_bytes_per_subtask=2048,
                        over_inflight_budget="abort")
    await api.trigger(job["id"])
    await api.client.post(f"/api/v1/jobs/{job['id']}/savepoints", json={})
    triggered = [e["data"] for e in await api.events(job["id"]) if e["type"] == "checkpoint.triggered"]
    assert (triggered[0]["inflight_budget"], triggered[0]["over_inflight_budget"]) == (1024, "abort")  # 4 subtasks
    assert triggered[1]["is_savepoint"] and triggered[1]["inflight_budget"] is None  # aligned: nothing in flight


async def test_savepoints_are_aligned_and_bypass_max_concurrent(api):
    job = await api.job(policy="unaligned")
    await api.trigger(job["id"])
    r = await api.client.post(f"/api/v1/jobs/{job['id']}/savepoints", json={})
    assert r.status_code == 201
    assert r.json()["policy"] == "aligned" and r.json()["is_savepoint"] is True
    assert r.json()["checkpoint_type"] == "savepoint"


async def test_stop_with_savepoint_finishes_the_job_when_it_completes(api):
    job = await api.job()
    sp = (await api.client.post(f"/api/v1/jobs/{job['id']}/savepoints", json={"stop": True})).json()
    await api.ack_all(job, sp["id"])
    j = (await api.client.get(f"/api/v1/jobs/{job['id']}")).json()
    assert j["status"] == "FINISHED" and f"savepoint {sp['id']}" in j["status_message"]


async def test_retention_deletes_blobs_of_old_checkpoints_but_never_savepoints_or_the_latest(api):
    job = await api.job(retained=2, max_concurrent=1)
    store_root = api.ctx.store
    blob_of: dict[int, str] = {}
    for n in range(1, 6):
        savepoint = n == 2
        if savepoint:
            cp = (await api.client.post(f"/api/v1/jobs/{job['id']}/savepoints", json={})).json()
        else:
            cp = (await api.trigger(job["id"])).json()
        data = f"state of {n}".encode()
        up = (await api.upload(job["id"], cp["id"], "agg", 0, data, kind="operator")).json()
        blob_of[cp["id"]] = up["blob_id"]
        for v in ("src", "agg"):
            for i in range(2):
                extra = {}
                if (v, i) == ("agg", 0):
                    extra["operator_state"] = {
                        "blob_id": up["blob_id"],
                        "sha256": up["sha256"],
                        "size": up["size"],
                    }
                r = await api.ack(job["id"], cp["id"], v, i, **extra)
                assert r.status_code == 200, r.text

    async def stored(cp_id):
        return await store_root.size(upload_key(job["id"], cp_id, blob_of[cp_id])) is not None

    # 1 and 3 are collected (only 4 and 5 are retained); 2 is a savepoint.
    # collected in the background after the commit of the ack that completed a newer checkpoint
    await api.wait_for(lambda: _not(stored(1)), what="blob of checkpoint 1 deleted")
    await api.wait_for(lambda: _not(stored(3)), what="blob of checkpoint 3 deleted")
    assert await stored(2) and await stored(4) and await stored(5)
    assert (await api.checkpoint(job["id"], 1))["discarded"] is True
    assert (await api.checkpoint(job["id"], 4))["discarded"] is False


async def _not(coro):
    return not await coro


async def test_a_checkpoint_past_its_timeout_is_aborted_and_counts_as_a_failure(api):
    job = await api.job(timeout=150, tolerable_failures=0)
    cp = (await api.trigger(job["id"])).json()

    async def aborted():
        c = await api.checkpoint(job["id"], cp["id"])
        return c if c["status"] == "ABORTED" else None

    c = await api.wait_for(aborted, what="expiry")
    assert c["failure_reason"].startswith("expired") and "0 of 4 acked" in c["failure_reason"]
    j = (await api.client.get(f"/api/v1/jobs/{job['id']}")).json()
    assert j["status"] == "FAILING" and j["consecutive_failures"] == 1
    # a completed checkpoint brings the job back to RUNNING
    await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={})
    j = (await api.client.get(f"/api/v1/jobs/{job['id']}")).json()
    assert j["status"] == "RUNNING"


async def test_failures_within_tolerable_failures_keep_the_job_running(api):
    job = await api.job(tolerable_failures=2)
    for n in (1, 2):
        await api.trigger(job["id"])
        await api.client.post(
            f"/api/v1/jobs/{job['id']}/checkpoints/{n}/declines",
            json={"attempt": 1, "vertex": "agg", "subtask_index": 1, "reason": "disk full"},
        )
    j = (await api.client.get(f"/api/v1/jobs/{job['id']}")).json()
    assert j["status"] == "RUNNING" and j["consecutive_failures"] == 2
    await api.trigger(job["id"])
    await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/3/declines",
        json={"attempt": 1, "vertex": "agg", "subtask_index": 1, "reason": "disk full"},
    )
    assert (await api.client.get(f"/api/v1/jobs/{job['id']}")).json()["status"] == "FAILING"


async def test_decline_aborts_with_the_subtasks_reason_and_late_acks_get_409_saying_why(api):
    job = await api.job(tolerable_failures=5)
    await api.trigger(job["id"])
    r = await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/1/declines",
        json={"attempt": 1, "vertex": "agg", "subtask_index": 1, "reason": "superseded by 2"},
    )
    assert r.status_code == 200 and r.json()["status"] == "ABORTED"
    assert "agg[1]: superseded by 2" in r.json()["failure_reason"]
    late = await api.ack(job["id"], 1, "src", 0)
    assert late.status_code == 409
    assert "aborted (declined: subtask agg[1]: superseded by 2)" in late.json()["error"]["message"]
    # a retried decline changes nothing
    again = await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/1/declines",
        json={"attempt": 1, "vertex": "agg", "subtask_index": 1, "reason": "superseded by 2"},
    )
    assert again.status_code == 200
    assert (await api.client.get(f"/api/v1/jobs/{job['id']}")).json()["consecutive_failures"] == 1


async def test_completed_checkpoint_cannot_be_declined(api):
    job = await api.job()
    await api.trigger(job["id"])
    await api.ack_all(job, 1)
    r = await api.client.post(
        f"/api/v1/jobs/{job['id']}/checkpoints/1/declines",
        json={"attempt": 1, "vertex": "agg", "subtask_index": 1, "reason": "late"},
    )
    assert r.status_code == 409 and "COMPLETED" in r.json()["error"]["message"]


async def test_alignment_timeout_publishes_switch_to_unaligned_once(api):
    job = await api.job(policy="aligned_then_unaligned", alignment_timeout=50)
    cp = (await api.trigger(job["id"])).json()
    assert cp["alignment_timeout"] == 50

    async def switched():
        return [e for e in await api.events(job["id"]) if e["type"] == "checkpoint.switch_to_unaligned"]

    events = await api.wait_for(switched, what="switch_to_unaligned")
    assert events[0]["data"]["checkpoint_id"] == cp["id"]
    detail = await api.checkpoint(job["id"], cp["id"])
    assert detail["switched_to_unaligned_timestamp"] >= cp["trigger_timestamp"] + 50
    await api.ctx.db.ping()
    assert len(await switched()) == 1


async def test_the_interval_triggers_checkpoints_periodically(api):
    job = await api.job(interval=50, max_concurrent=1)

    async def triggered():
        return [e for e in await api.events(job["id"]) if e["type"] == "checkpoint.triggered"]

    first = await api.wait_for(triggered, what="a periodic trigger")
    assert first[0]["data"]["policy"] == "aligned_then_unaligned"
    # with max_concurrent=1 and nothing acked, no second checkpoint is triggered
    await api.ack_all(job, 1)
    await api.wait_for(lambda: _more_than(triggered(), 1), what="a second periodic trigger")
    ids = [e["data"]["checkpoint_id"] for e in await triggered()]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


async def _more_than(coro, n):
    return len(await coro) > n
