"""The scheduler: one job's failure is logged, counted and shown on that job and never holds up another job's
checkpoints; an attempt that waits for its subtasks starts its periodic checkpoints once they all run."""

from __future__ import annotations

import asyncio

from sqlalchemy import select, text, update

from app.db.models import JobRow


async def _completed_or_pending(api, job_id: int) -> int:
    page = (await api.client.get(f"/api/v1/jobs/{job_id}/checkpoints", params={"limit": 1000})).json()
    return page["total"]


async def test_a_job_whose_trigger_fails_shows_it_and_does_not_hold_up_another_job(api):
    bad = await api.job(interval=50, max_concurrent=1000)
    # a job whose checkpoint ids ran out: its next id cannot be stored, so every trigger of it fails
    async with api.ctx.tx() as s:
        await s.execute(update(JobRow).where(JobRow.id == bad["id"]).values(next_checkpoint_id=2**63 - 1))
    good = await api.job(interval=50, max_concurrent=1000, timeout=600_000)

    async def good_has_three():
        return await _completed_or_pending(api, good["id"]) >= 3

    await api.wait_for(good_has_three, timeout=30, what="three periodic checkpoints of the healthy job")

    async def shown():
        return (await api.client.get(f"/api/v1/jobs/{bad['id']}")).json()["scheduler_error"]

    error = await api.wait_for(shown, timeout=30, what="the failure shown on the bad job")
    assert "could not trigger" in error
    assert await _completed_or_pending(api, bad["id"]) == 0
    metrics = (await api.client.get("/metrics")).text
    assert 'overtake_scheduler_failures_total{action="trigger"}' in metrics


async def test_an_attempt_waiting_for_its_subtasks_gets_no_periodic_checkpoint_before_they_all_run(
    make_api,
):
    async with make_api(running_grace=3600) as api:
        job = await api.job(start=False, interval=20, max_concurrent=1000)
        started = await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={"wait_for_running": True})
        assert started.status_code == 201
        other = await api.job(interval=20, max_concurrent=1000)  # the clock: its checkpoints show time passing

        async def other_has_five():
            return await _completed_or_pending(api, other["id"]) >= 5

        await api.wait_for(other_has_five, timeout=30, what="time to pass")
        assert await _completed_or_pending(api, job["id"]) == 0
        for vertex, index in (("src", 0), ("src", 1), ("agg", 0), ("agg", 1), ("agg", 1)):  # one twice
            r = await api.client.post(
                f"/api/v1/jobs/{job['id']}/attempts/1/running", json={"vertex": vertex, "subtask_index": index}
            )
            assert r.status_code == 200, r.text
        state = r.json()
        assert state["running_subtasks"] == 4 and state["all_running_at"] is not None

        async def has_one():
            return await _completed_or_pending(api, job["id"]) >= 1

        await api.wait_for(has_one, timeout=30, what="the first periodic checkpoint after all reported running")
        assert (await api.client.get(f"/api/v1/jobs/{job['id']}")).json()["running_at"] == state["all_running_at"]


async def test_a_waiting_attempt_whose_subtasks_never_report_gets_checkpoints_after_the_grace_period(make_api):
    async with make_api(running_grace=0.2) as api:
        job = await api.job(start=False, interval=20, max_concurrent=1000)
        await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={"wait_for_running": True})

        async def has_one():
            return await _completed_or_pending(api, job["id"]) >= 1

        await api.wait_for(has_one, timeout=30, what="a periodic checkpoint after the grace period")


async def test_a_running_report_from_another_attempt_or_for_an_unknown_subtask_is_refused(sqlite_api):
    job = await sqlite_api.job()
    r = await sqlite_api.client.post(
        f"/api/v1/jobs/{job['id']}/attempts/2/running", json={"vertex": "src", "subtask_index": 0}
    )
    assert r.status_code == 409 and "attempt" in r.json()["error"]["message"]
    r = await sqlite_api.client.post(
        f"/api/v1/jobs/{job['id']}/attempts/1/running", json={"vertex": "src", "subtask_index": 7}
    )
    assert r.status_code == 404 and "src[7]" in r.json()["error"]["message"]


async def test_no_checkpoint_or_savepoint_is_triggered_while_a_waiting_attempt_still_starts(make_api):
    """A restored subtask replays its in-flight data before it reports running; a checkpoint before then could not
    be replayed in order, so manual triggers and savepoints are refused too, saying why, until all run."""
    async with make_api(running_grace=3600) as api:
        job = await api.job(start=False, interval=None)
        await api.client.post(f"/api/v1/jobs/{job['id']}/attempts", json={"wait_for_running": True})
        for route in ("checkpoints", "savepoints"):
            r = await api.client.post(f"/api/v1/jobs/{job['id']}/{route}")
            assert r.status_code == 409 and "still starting" in r.json()["error"]["message"], r.text
        for vertex, index in (("src", 0), ("src", 1), ("agg", 0), ("agg", 1)):
            r = await api.client.post(
                f"/api/v1/jobs/{job['id']}/attempts/1/running", json={"vertex": vertex, "subtask_index": index}
            )
            assert r.status_code == 200, r.text
        r = await api.client.post(f"/api/v1/jobs/{job['id']}/checkpoints")
        assert r.status_code == 201, r.text


async def test_a_periodic_checkpoint_is_stamped_when_it_is_triggered_not_when_the_schedulers_pass_began(make_api):
    """A pass does other work first (timeouts, switches, every job's schedule); the checkpoint's duration counts
    from the moment it is created, as Flink's trigger timestamp does."""
    from app.domain.context import now_ms
    from app.scheduler import Scheduler

    async with make_api(scheduler_enabled=False) as api:  # this test runs the scheduler's pass itself
        job = await api.job(interval=50)
        await asyncio.sleep(0.2)  # its first checkpoint is due
        pass_began = now_ms()
        await asyncio.sleep(0.05)  # the pass's other work
        before = now_ms()
        await Scheduler(api.ctx)._periodic_triggers(pass_began)
        cp = await api.checkpoint(job["id"], 1)
        assert cp["trigger_timestamp"] >= before


async def test_a_periodic_trigger_reads_the_jobs_pending_checkpoints_once(make_api):
    """The trigger's transaction holds the job's row lock from its first statement; the pending checkpoints it
    checks the job's limits against are read once, not again by the trigger."""
    from app.domain.context import now_ms
    from app.scheduler import Scheduler
    from tests.coordinator._sql import recorded_statements

    async with make_api(scheduler_enabled=False) as api:  # this test runs the scheduler's pass itself
        job = await api.job(interval=50, max_concurrent=2)
        await asyncio.sleep(0.2)  # its first checkpoint is due
        with recorded_statements(api) as statements:
            await Scheduler(api.ctx)._periodic_triggers(now_ms())
        assert (await api.checkpoint(job["id"], 1))["status"] == "PENDING"
        pending_reads = [st for st in statements if st.startswith("SELECT CHECKPOINTS.ID FROM CHECKPOINTS")]
        assert len(pending_reads) == 1, pending_reads


async def test_a_trigger_runs_no_pass_and_the_scheduler_still_acts_at_its_checkpoints_deadlines(make_api):
    """A pass right after every trigger would read the database while the checkpoint's subtasks ack it. The
    trigger's event says when its checkpoint can next need the scheduler (its switch to unaligned, its timeout):
    nothing runs before then, and the switch and the timeout still come on time, with the idle pass a long way
    off (`max_idle` raised, so only the trigger's deadlines can bring them)."""
    async with make_api() as api:
        scheduler = api.app.state.scheduler
        scheduler.max_idle = 60.0
        quiet = await api.job(policy="unaligned", timeout=600_000)
        switching = await api.job(policy="aligned_then_unaligned", alignment_timeout=300, timeout=600_000)
        expiring = await api.job(policy="unaligned", timeout=400, tolerable_failures=100)
        await asyncio.sleep(0.3)  # the passes the jobs' events asked for

        passes = scheduler.passes
        assert (await api.trigger(quiet["id"])).status_code == 201
        await asyncio.sleep(0.3)  # fifteen ticks
        assert scheduler.passes == passes  # the trigger ran none

        cp = (await api.trigger(switching["id"])).json()

        async def switched():
            return [e for e in await api.events(switching["id"]) if e["type"] == "checkpoint.switch_to_unaligned"]

        await api.wait_for(switched, timeout=20, what="the switch at the alignment timeout")
        detail = await api.checkpoint(switching["id"], cp["id"])
        assert detail["switched_to_unaligned_timestamp"] >= cp["trigger_timestamp"] + 300

        cp = (await api.trigger(expiring["id"])).json()

        async def expired():
            return (await api.checkpoint(expiring["id"], cp["id"]))["status"] == "ABORTED"

        await api.wait_for(expired, timeout=20, what="the checkpoint's timeout")
        assert (await api.checkpoint(quiet["id"], 1))["status"] == "PENDING"


async def test_an_expired_checkpoint_is_stamped_when_it_is_aborted_not_when_the_schedulers_pass_began(make_api):
    """Acks recorded while a pass does its other work still count toward the checkpoint the pass then expires (the
    abort's reason says so); its failure timestamp is when it was aborted, after theirs, not the pass's start."""
    from app.domain.context import now_ms
    from app.scheduler import Scheduler

    async with make_api(scheduler_enabled=False) as api:  # this test runs the scheduler's pass itself
        job = await api.job(parallelism={"src": 2}, timeout=50)
        cp_id = (await api.trigger(job["id"])).json()["id"]
        await asyncio.sleep(0.1)  # past its timeout
        pass_began = now_ms()
        await asyncio.sleep(0.02)  # the pass's other work, while an ack is recorded
        assert (await api.ack(job["id"], cp_id, "src", 0)).status_code == 200
        await Scheduler(api.ctx)._expire_and_switch(pass_began)
        cp = await api.checkpoint(job["id"], cp_id)
        assert cp["status"] == "ABORTED" and "(1 of 2 acked)" in cp["failure_reason"], cp["failure_reason"]
        (acked,) = cp["subtasks"]
        assert cp["failure_timestamp"] >= acked["ack_timestamp"], (cp["failure_timestamp"], acked["ack_timestamp"])


async def test_trimming_the_event_logs_visits_only_jobs_with_events_to_trim(make_api):
    """A sweep ran one transaction per job whose event counter had passed `event_retention`, trimmed or not:
    with hundreds of finished jobs, hundreds of DELETEs every sweep. Once a log is trimmed, the sweep reads which
    jobs have something to trim in one statement and visits none, however many jobs there are."""
    from app.db.models import EventRow
    from app.scheduler import Scheduler
    from tests.coordinator._sql import recorded_statements

    async with make_api(scheduler_enabled=False, event_retention=1) as api:
        jobs = [await api.job() for _ in range(6)]
        for job in jobs:
            assert (await api.trigger(job["id"])).status_code == 201  # a second event in its log
        scheduler = Scheduler(api.ctx)
        with recorded_statements(api) as statements:
            await scheduler._trim_events()
        assert sum(st.startswith("DELETE FROM EVENTS") for st in statements) == len(jobs), statements
        async with api.ctx.tx(readonly=True) as s:
            for job in jobs:
                seqs = (await s.execute(select(EventRow.seq).where(EventRow.job_id == job["id"]))).scalars().all()
                assert len(seqs) == 1
        with recorded_statements(api) as statements:
            await scheduler._trim_events()
        assert [st.split()[0] for st in statements if not st.startswith("BEGIN")] == ["SELECT"], statements


async def test_a_periodic_trigger_held_back_by_a_pending_checkpoint_waits_for_its_end_not_for_a_poll(make_api):
    """The pass that finds the next periodic checkpoint due but held back by one in progress does not poll the job
    again every interval: the end of that checkpoint wakes a pass at once (no tick), and that pass triggers it first,
    before reading every job's deadlines. With min_pause the pass looks again when the pause is over."""
    from app.domain.context import now_ms
    from app.scheduler import FAR, Scheduler
    from contract.models import Event

    async with make_api(scheduler_enabled=False) as api:  # this test runs the scheduler's passes itself
        scheduler = Scheduler(api.ctx)
        job = await api.job(parallelism={"src": 1}, interval=20, timeout=600_000)
        paused = await api.job(parallelism={"src": 1}, interval=20, min_pause=60_000, timeout=600_000)
        await asyncio.sleep(0.05)  # both first checkpoints are due
        assert await scheduler._periodic_triggers(now_ms()) < FAR
        await asyncio.sleep(0.05)  # the second ones are due too, held back by the first
        assert await scheduler._periodic_triggers(now_ms()) == FAR  # nothing to poll: an end will wake a pass

        assert (await api.ack(job["id"], 1, "src", 0)).status_code == 200
        assert (await api.ack(paused["id"], 1, "src", 0)).status_code == 200
        (completed,) = [e for e in await api.events(job["id"]) if e["type"] == "checkpoint.completed"]
        # the bus handed both completions to the scheduler already; once more, as a replica's copy of one would be
        scheduler._heard(Event.model_validate(completed))
        assert scheduler._ended and scheduler._wake.is_set()  # a pass at once, without the tick
        # both held-back triggers are due at once: they go first in that pass, before it reads every job
        assert scheduler._known == {job["id"]: (0, 20), paused["id"]: (0, 20)}

        assert await scheduler._known_triggers(now_ms()) >= now_ms()
        assert await _completed_or_pending(api, job["id"]) == 2  # triggered first by that pass
        assert await _completed_or_pending(api, paused["id"]) == 1  # its pause is not over
        done_at = (await api.checkpoint(paused["id"], 1))["completed_timestamp"]
        triggered_at = (await api.checkpoint(job["id"], 2))["trigger_timestamp"]
        assert scheduler._known == {job["id"]: (triggered_at + 20, 20), paused["id"]: (done_at + 60_000, 20)}
        before = now_ms()
        await scheduler._periodic_triggers(before)
        assert await _completed_or_pending(api, job["id"]) == 2  # the pass's reads find it triggered already
        assert await _completed_or_pending(api, paused["id"]) == 1  # its pause is not over
        assert await scheduler._trigger(paused["id"], 20, now_ms()) == done_at + 60_000  # looked at when it ends


async def test_a_deadline_the_scheduler_cannot_act_on_is_retried_once_a_tick_not_in_a_spin(make_api):
    """A checkpoint past its timeout whose abort keeps failing stays overdue: the passes after it are spaced by the
    tick, however small the scheduler could make them."""
    from app.scheduler import Scheduler

    async with make_api(scheduler_tick=0.1) as api:
        scheduler = api.app.state.scheduler
        job = await api.job(parallelism={"src": 1}, timeout=50, tolerable_failures=100)
        assert (await api.trigger(job["id"])).status_code == 201
        failing = 0

        async def cannot(self, job_id, cp_id, now):
            nonlocal failing
            failing += 1
            raise RuntimeError("the job's row cannot be written")

        original = Scheduler._expire_or_switch
        Scheduler._expire_or_switch = cannot
        try:
            await api.wait_for(lambda: _true_if(failing >= 1), timeout=20, what="the overdue checkpoint's first try")
            passes = scheduler.passes
            await asyncio.sleep(1.0)
            ran = scheduler.passes - passes
        finally:
            Scheduler._expire_or_switch = original
        assert 1 <= ran <= 12, f"{ran} passes in 1 s with a tick of 0.1 s"


async def _true_if(value: bool) -> bool:
    return value


async def test_a_deadline_known_from_an_earlier_pass_triggers_first_and_is_checked_again_under_the_lock(make_api):
    """A pass that wakes at a periodic deadline it knows triggers that checkpoint before reading every job (two
    transactions the trigger would otherwise come after); the job's row, locked, has the last word: a trigger taken
    meanwhile (here the API's) moves the deadline, and nothing is triggered sooner than one interval after it."""
    from app.domain.context import now_ms
    from app.scheduler import Scheduler

    async with make_api(scheduler_enabled=False) as api:  # this test runs the scheduler's passes itself
        scheduler = Scheduler(api.ctx)
        job = await api.job(parallelism={"src": 1}, interval=200, max_concurrent=5, timeout=600_000)
        await asyncio.sleep(0.25)
        await scheduler._periodic_triggers(now_ms())
        assert await _completed_or_pending(api, job["id"]) == 1
        first = (await api.checkpoint(job["id"], 1))["trigger_timestamp"]
        assert scheduler._known[job["id"]] == (first + 200, 200)

        assert await scheduler._known_triggers(first + 199) == first + 200  # not due: nothing done
        assert await _completed_or_pending(api, job["id"]) == 1
        await asyncio.sleep(max(0.0, (first + 200 - now_ms()) / 1000))
        await scheduler._known_triggers(now_ms())  # due: triggered without the pass's reads
        assert await _completed_or_pending(api, job["id"]) == 2
        second = (await api.checkpoint(job["id"], 2))["trigger_timestamp"]
        assert second >= first + 200 and scheduler._known[job["id"]] == (second + 200, 200)

        assert (await api.trigger(job["id"])).status_code == 201  # the API's trigger moves the deadline
        third = (await api.checkpoint(job["id"], 3))["trigger_timestamp"]
        await asyncio.sleep(max(0.0, (second + 200 - now_ms()) / 1000))
        assert await scheduler._known_triggers(max(now_ms(), second + 200)) == third + 200  # checked under the lock
        assert await _completed_or_pending(api, job["id"]) == 3


async def test_a_periodic_trigger_waits_a_bounded_while_for_its_jobs_row_lock_on_postgresql(
    make_api, pg_url, monkeypatch
):
    """A deadline that falls while another transaction holds the job's row (at a short interval, often the previous
    checkpoint's completing acks) is triggered as soon as that transaction ends, not skipped until the next pass
    (which came 5-7 ms late at a 10 ms interval). The wait has a bound: a lock held longer leaves the job to a later
    pass, and is no failure of the job's."""
    from app import scheduler as sched
    from app.domain.context import lock_job, now_ms

    async with make_api(database_url=pg_url, scheduler_enabled=False) as api:  # the test runs the triggers itself
        scheduler = sched.Scheduler(api.ctx)
        job = await api.job(parallelism={"src": 1}, interval=50, max_concurrent=5, timeout=600_000)
        await asyncio.sleep(0.1)  # the first deadline has passed
        release = asyncio.Event()

        async def hold(held: asyncio.Event) -> None:
            async with api.ctx.tx() as s:
                await lock_job(s, job["id"])
                held.set()
                await release.wait()

        async def waiting_for_a_lock() -> bool:
            async with api.ctx.db.session(readonly=True) as s:
                return (await s.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                ))).scalar() == 1

        monkeypatch.setattr(sched, "LOCK_WAIT_MS", 60_000)
        held = asyncio.Event()
        holding = asyncio.create_task(hold(held))
        await asyncio.wait_for(held.wait(), 10)
        triggering = asyncio.create_task(scheduler._trigger(job["id"], 50, now_ms()))
        await api.wait_for(waiting_for_a_lock, timeout=10, what="the trigger waiting for the job's row")
        assert not triggering.done() and await _completed_or_pending(api, job["id"]) == 0
        release.set()
        await asyncio.wait_for(holding, 10)
        due = await asyncio.wait_for(triggering, 10)
        assert await _completed_or_pending(api, job["id"]) == 1  # triggered once the lock was free
        first = (await api.checkpoint(job["id"], 1))["trigger_timestamp"]
        assert due == first + 50 and scheduler._known[job["id"]] == (first + 50, 50)

        # held past the bound: the trigger gives up, and the job is looked at again in a later pass
        monkeypatch.setattr(sched, "LOCK_WAIT_MS", 100)
        await asyncio.sleep(0.06)
        release.clear()
        held = asyncio.Event()
        holding = asyncio.create_task(hold(held))
        await asyncio.wait_for(held.wait(), 10)
        now = now_ms()
        assert await asyncio.wait_for(scheduler._trigger(job["id"], 50, now), 10) == now + 50
        assert scheduler._known[job["id"]] == (now, 50)  # due at once in the next pass
        release.set()
        await asyncio.wait_for(holding, 10)
        assert await _completed_or_pending(api, job["id"]) == 1
        assert (await api.client.get(f"/api/v1/jobs/{job['id']}")).json()["scheduler_error"] is None
        await scheduler._known_triggers(now_ms())
        assert await _completed_or_pending(api, job["id"]) == 2
