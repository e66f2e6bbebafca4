"""The scheduler inside the service: periodic triggers, checkpoint timeouts, alignment-timeout switches,
and sweeps (checkpoints' prefixes in the blob store, old events). Safe with several replicas: each action re-checks its condition
under the job row lock, so it happens once. Timeouts and switches take it with SKIP LOCKED (a later pass looks
again); a periodic trigger waits for it a bounded `LOCK_WAIT_MS`, so that a deadline falling inside another
transaction on the job (the previous checkpoint's completing acks) goes as soon as that commits.

Jobs are isolated: an action that fails on one job is logged, counted (`overtake_scheduler_failures_total`) and
shown on that job (`scheduler_error`), and the pass goes on with the other jobs.

It does not poll the database every tick: each pass computes when the next thing falls due and sleeps
until then (at most `max_idle` seconds), or until an event (from this or another replica) wakes it. A deadline in
the future is kept to the millisecond; `tick` only spaces passes that an event woke
(a burst of events settles into one pass) or whose deadline had already passed (nothing spins on a deadline it could
not act on). A checkpoint's completion or abort runs a pass at once: the next periodic trigger may be due already,
held back only by the checkpoint that just ended.

A pass first triggers the periodic checkpoints it knows to be due (from an earlier look at the job: their deadline
has come, or the checkpoint that held them back has ended); `_trigger` looks again under the job's lock, so a
deadline known from before is never acted on blindly. Only then, and only when something may have changed that the
scheduler does not know of, does it read every job's deadlines (two transactions): after an event other than a
checkpoint's trigger or end, when a checkpoint's own deadline (a switch to unaligned, a timeout) has come, or
`max_idle` after the last reading. A trigger that waited for those reads came that much past its interval (4-8 ms on
PostgreSQL, at every interval), and reads right after a trigger compete with its checkpoint's acks."""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy import case, func, select, update

from app.db.models import CheckpointRow, EventRow, JobRow
from app.db.session import LockWaitTimeout
from app.domain import history
from app.domain.checkpoints import ACTIVE, abort_checkpoint, pending_ids, trigger, trigger_refusal
from app.domain.context import BackgroundWorker, Context, lock_job, now_ms
from app.domain.lifecycle import PENDING, AbortReason
from app.errors import DomainError
from app.events import emit, trim_log
from app.observability import SCHEDULER_FAILURES
from contract.events import SwitchToUnaligned
from contract.models import CheckpointConfig, EventType

log = logging.getLogger(__name__)
FAR = 2**62
_FLOOR = 0.001
"""The shortest sleep between two passes (s), when the next deadline is still ahead."""
LOCK_WAIT_MS = 20
"""How long a periodic trigger waits for its job's row lock (PostgreSQL) before it leaves the job to a later pass:
longer than a checkpoint's completing transaction or an ack batch holds it, short enough that the pass's other
jobs do not wait long behind one."""
_ENDED = (EventType.checkpoint_completed, EventType.checkpoint_aborted)  # compared with ==: a str-valued enum hashes by its name


class Scheduler(BackgroundWorker):
    name = "overtake-scheduler"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.tick = ctx.settings.scheduler_tick
        self.max_idle = 1.0
        self._wake = asyncio.Event()
        self._sooner = FAR  # the earliest deadline a trigger event brought since the last pass began
        self._rearm = asyncio.Event()
        self._ended = False  # a checkpoint completed or aborted since the last pass began: pass at once
        self._other = True  # any other event (not a trigger) since the last pass began: the pass reads every job
        self._reads_due = 0
        """When a pass must next read every job's deadlines (ms since the epoch): the earliest checkpoint deadline
        it knows (read, or heard in a trigger), or `max_idle` after the last reading."""
        self._pass_began = 0  # when the last pass began (ms since the epoch)
        self._known: dict[int, tuple[int, int]] = {}
        """job id -> (when its next periodic checkpoint falls due, its interval), as the last look at the job found:
        FAR while checkpoints in progress hold it back (the end of one makes it due at once, `_heard`)."""
        self._next_sweep = 0.0
        self._sweeping: asyncio.Task | None = None
        self.passes = 0
        """Passes run so far (for tests)."""
        ctx.bus.add_listener(self._heard)

    def _heard(self, event) -> None:
        """An event from this or another replica. A checkpoint's trigger says when that checkpoint can next need
        the scheduler (its alignment timeout's switch, its timeout): the scheduler sleeps until then at most, and
        runs no pass for it now. A pass right after every trigger would read the database while the checkpoint's
        subtasks ack it, the busiest moment of a fast checkpoint. A checkpoint that ended wakes a pass at once (the
        job's next trigger may be waiting for it: it is due now); any other event wakes one after `tick`, which reads
        every job."""
        if getattr(event, "type", None) in _ENDED:
            known = self._known.get(getattr(event, "job_id", None))
            if known is not None and known[0] == FAR:
                self._known[event.job_id] = (0, known[1])  # held back by checkpoints in progress: due at once
            self._ended = True
            self._wake.set()
            return
        due = _trigger_deadline(event)
        if due is None:
            self._other = True
            self._wake.set()
        else:
            self._sooner = min(self._sooner, due)
            self._reads_due = min(self._reads_due, due)
            self._rearm.set()

    async def _run(self) -> None:
        while True:
            next_due = now_ms() + self.max_idle * 1000
            self._wake.clear()
            read = self._other or now_ms() >= self._reads_due
            self._ended = self._other = False
            self._sooner = FAR  # a trigger heard from here on is either seen by this pass or kept for the next
            try:
                next_due = await self.run_once(read=read)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep scheduling
                log.exception("scheduler pass failed")
            if await self._sleep(next_due) and not self._ended:
                # let a burst of events settle into one pass, but not past a deadline already known
                due_in = (min(next_due, self._sooner) - now_ms()) / 1000
                await asyncio.sleep(max(0.0, min(self.tick, due_in)))

    async def _sleep(self, next_due: int) -> bool:
        """Until the next deadline (the pass's, or a trigger's heard since) falls due, at most `max_idle` seconds
        after the pass; at least `tick` after it when the pass's deadline had passed already when the pass began
        (what it could not act on, e.g. a checkpoint another replica held, waits a tick; a deadline that fell due
        while the pass ran does not). True when an event woke the scheduler before then."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        floor = self.tick if next_due <= self._pass_began else _FLOOR  # overdue already when the pass began
        while True:
            self._rearm.clear()
            # from the clock's fraction of a millisecond: from `now_ms`, truncated, the wake-up came up to 1 ms late
            due_in = (min(next_due, self._sooner) - time.time() * 1000) / 1000
            elapsed = loop.time() - began
            delay = min(self.max_idle, max(floor, elapsed + due_in)) - elapsed
            if delay <= 0:
                return False
            # asyncio.wait, not wait_for: wait_for can swallow a cancellation that races a wake-up (Python < 3.12).
            woken = asyncio.ensure_future(self._wake.wait())
            rearmed = asyncio.ensure_future(self._rearm.wait())
            try:
                done, _ = await asyncio.wait({woken, rearmed}, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()
                rearmed.cancel()
            if woken in done:
                return True
            if not done:
                return False

    async def run_once(self, read: bool = True) -> int:
        """One pass; returns when (ms since the epoch) the next known deadline falls due. `read`: read every job's
        deadlines too, after the triggers known to be due."""
        self.passes += 1
        now = self._pass_began = now_ms()
        next_due = await self._known_triggers(now)
        if read:
            self._reads_due = now + int(self.max_idle * 1000)  # lowered by a trigger heard from here on
            expiry = await self._expire_and_switch(now)
            self._reads_due = min(self._reads_due, expiry)
            next_due = min(next_due, expiry, await self._periodic_triggers(now))
        next_due = min(next_due, self._reads_due)
        if time.monotonic() >= self._next_sweep and (self._sweeping is None or self._sweeping.done()):
            self._next_sweep = time.monotonic() + 10
            # in a task of its own: the sweep waits for the blob store, which may be slow or away, and the passes
            # (timeouts, triggers) must go on meanwhile; one sweep at a time
            self._sweeping = asyncio.create_task(self._sweep(), name="overtake-sweep")
        return next_due

    async def _sweep(self) -> None:
        try:
            await self.ctx.sweep_state()
            await self._trim_events()
            await history.trim(self.ctx, self.ctx.settings.checkpoint_history)
        except Exception:  # noqa: BLE001 - the next sweep tries again
            log.exception("scheduler sweep failed")

    async def stop(self) -> None:
        if self._sweeping is not None:
            self._sweeping.cancel()
            await asyncio.wait({self._sweeping}, timeout=5)
        await super().stop()

    async def _expire_and_switch(self, now: int) -> int:
        async with self.ctx.tx(readonly=True) as s:
            upcoming = (
                await s.execute(
                    select(
                        func.min(CheckpointRow.timeout_at),
                        func.min(case((CheckpointRow.switched_ts.is_(None), CheckpointRow.switch_at))),
                    ).where(CheckpointRow.status == PENDING)
                )
            ).one()
            due = (
                await s.execute(
                    select(CheckpointRow.job_id, CheckpointRow.id).where(
                        CheckpointRow.status == PENDING,
                        (CheckpointRow.timeout_at <= now)
                        | ((CheckpointRow.switch_at <= now) & CheckpointRow.switched_ts.is_(None)),
                    )
                )
            ).all()
        for job_id, cp_id in due:
            try:
                await self._expire_or_switch(job_id, cp_id, now)
            except Exception as exc:  # noqa: BLE001 - one job's failure must not hold up the others
                await self._failed(job_id, "expire_or_switch", exc)
        return min((t for t in upcoming if t is not None), default=FAR)

    async def _expire_or_switch(self, job_id: int, cp_id: int, now: int) -> None:
        # the expired checkpoint's prefix is cleaned in the background: a store that does not answer must not hold
        # up the pass (other jobs' timeouts and triggers)
        async with self.ctx.tx(defer_cleanup=True) as s:
            job = await lock_job(s, job_id, skip_locked=True)
            if job is None:
                return  # another replica (or an ack batch) holds it; next pass
            cp = await s.get(CheckpointRow, (job_id, cp_id))
            if cp is None or cp.status != PENDING:
                return
            # Stamped when it happens, not when this pass began: acks recorded meanwhile (the pass's other work, on
            # every job, came first) are counted by the abort, so its timestamp must not precede theirs.
            now = max(now, now_ms())
            if cp.timeout_at <= now:
                await abort_checkpoint(
                    s,
                    job,
                    cp,
                    AbortReason.expired,
                    f"not acknowledged by all subtasks within timeout={cp.timeout_at - cp.trigger_ts} ms "
                    f"({cp.num_acked} of {cp.num_subtasks} acked)",
                    now,
                )
            elif cp.switch_at is not None and cp.switch_at <= now and cp.switched_ts is None:
                cp.switched_ts = now
                emit(
                    s,
                    job,
                    SwitchToUnaligned(
                        checkpoint_id=cp.id, attempt=cp.attempt, alignment_timeout=cp.alignment_timeout
                    ),
                    now,
                )

    async def _known_triggers(self, now: int) -> int:
        """The periodic triggers known to be due (`_known`), each as `_trigger`, which looks again under the job's
        lock (another replica may have triggered it, the job may have ended or changed)."""
        next_due = FAR
        for job_id, (due, interval) in list(self._known.items()):
            if due > now:
                next_due = min(next_due, due)
                continue
            del self._known[job_id]  # `_trigger` records what it finds
            try:
                next_due = min(next_due, await self._trigger(job_id, interval, now_ms()))
            except Exception as exc:  # noqa: BLE001 - one job's failure must not hold up the others
                await self._failed(job_id, "trigger", exc)
        return next_due

    async def _periodic_triggers(self, now: int) -> int:
        async with self.ctx.tx(readonly=True) as s:
            jobs = (
                await s.execute(
                    select(JobRow.id, JobRow.config, JobRow.last_trigger_at, JobRow.periodic_from).where(
                        JobRow.status.in_(ACTIVE)
                    )
                )
            ).all()
        next_due = FAR
        periodic = {job_id for job_id, config, *_ in jobs if isinstance(config, dict) and config.get("interval")}
        # (truthiness only: a value `_interval` cannot read fails that job's trigger below, not the pass)
        self._known = {job_id: known for job_id, known in self._known.items() if job_id in periodic}
        for job_id, config, last, periodic_from in jobs:
            if job_id not in periodic:
                continue
            try:
                interval = _interval(config)
                due = _due(last, periodic_from, interval)
                if now < due:
                    # as the job's row read: a trigger committed since (the API's, another replica's) moves it, and
                    # `_trigger` finds that under the lock
                    self._known[job_id] = (due, interval)
                    next_due = min(next_due, due)
                    continue
                next_due = min(next_due, await self._trigger(job_id, interval, now))
            except Exception as exc:  # noqa: BLE001 - one job's failure must not hold up the others
                next_due = min(next_due, now + 1000)
                await self._failed(job_id, "trigger", exc)
        return next_due

    async def _trigger(self, job_id: int, interval: int, now: int) -> int:
        """Triggers the job's periodic checkpoint if it may be taken now; returns when to look at the job again."""
        retry = now + interval
        try:
            return await self._trigger_locked(job_id, interval, now)
        except LockWaitTimeout:
            # held longer than `LOCK_WAIT_MS` (a long transaction, another replica's pass): the next pass looks
            # again, or, when a checkpoint's end woke it sooner, at once
            self._known[job_id] = (now, interval)
            return retry

    async def _trigger_locked(self, job_id: int, interval: int, now: int) -> int:
        retry = now + interval
        async with self.ctx.tx() as s:
            # Held by another transaction, the lock is waited for, a bounded while, rather than the job skipped: at
            # a short interval the deadline may fall inside the previous checkpoint's completing ack transaction,
            # which holds the lock for its last milliseconds; skipped, the trigger went only when that completion's
            # event arrived, 5-7 ms late. Another replica's scheduler that waits too finds the trigger taken (the
            # deadline is checked again below). Tried first without a wait: the bound costs a round trip.
            job = await lock_job(s, job_id, skip_locked=True)
            if job is None:
                job = await lock_job(s, job_id, wait_ms=LOCK_WAIT_MS)
            if job is None:  # deleted meanwhile
                self._known.pop(job_id, None)
                return retry
            if job.status not in ACTIVE:
                self._known.pop(job_id, None)
                return retry
            # The checkpoint is triggered now, not when this pass began (its other work, on every job, came first):
            # its trigger timestamp, from which its duration counts, is the time it is created.
            now = max(now, now_ms())
            # Re-check under the lock: another replica may have fired this one already, and the interval is the
            # job's now (a deadline known from an earlier pass may predate a change of it).
            interval = _interval(job.config)
            if interval is None:
                self._known.pop(job_id, None)
                return FAR
            retry = now + interval
            due = _due(job.last_trigger_at, job.periodic_from, interval)
            if now < due:
                self._known[job_id] = (due, interval)
                return due
            pending = await pending_ids(s, job.id)
            if trigger_refusal(job, pending, now, savepoint=False):
                cfg = CheckpointConfig.model_validate(job.config)
                if len(pending) >= cfg.max_concurrent:
                    # held back by checkpoints in progress: the end of one wakes a pass (`_heard`), which triggers
                    # this job first; no polling meanwhile (the idle pass, `max_idle`, is the fallback)
                    self._known[job_id] = (FAR, interval)
                    return FAR
                if cfg.min_pause and job.last_completed_at is not None:
                    self._known[job_id] = (job.last_completed_at + cfg.min_pause, interval)
                    return job.last_completed_at + cfg.min_pause
                return retry
            try:
                await trigger(
                    s, job, now, targets=self.ctx.write_target, backpressure=self.ctx.backpressure, pending=pending
                )
                job.scheduler_error = None
            except DomainError as exc:
                log.info("periodic trigger of job %s skipped: %s", job_id, exc.message)
        self._known[job_id] = (now + interval, interval)
        return now + interval

    async def _failed(self, job_id: int, action: str, exc: Exception) -> None:
        """Log and count a failed action on one job, and show it on the job."""
        SCHEDULER_FAILURES.labels(action).inc()
        log.error("scheduler: %s of job %s failed: %s: %s", action, job_id, type(exc).__name__, exc, exc_info=exc)
        message = f"the scheduler could not {action.replace('_', ' ')} at {now_ms()}: {type(exc).__name__}: {exc}"
        try:
            async with self.ctx.tx() as s:
                await s.execute(update(JobRow).where(JobRow.id == job_id).values(scheduler_error=message[:2000]))
        except Exception as record_exc:  # noqa: BLE001 - the log line above is what is left
            log.warning("scheduler: could not record the failure on job %s: %s", job_id, record_exc)

    async def _trim_events(self) -> None:
        """Events older than the newest `event_retention` of each job are deleted. Only jobs that have such events
        are visited: a job whose log was trimmed and that emits nothing more (a finished one) costs no transaction."""
        keep = self.ctx.settings.event_retention
        behind = select(EventRow.seq).where(EventRow.job_id == JobRow.id, EventRow.seq <= JobRow.event_seq - keep)
        async with self.ctx.tx(readonly=True) as s:
            jobs = (
                await s.execute(
                    select(JobRow.id, JobRow.event_seq).where(JobRow.event_seq > keep, behind.exists())
                )
            ).all()
        for job_id, seq in jobs:
            async with self.ctx.tx() as s:
                await trim_log(s, job_id, seq - keep)


def _interval(config) -> int | None:
    """A job's periodic interval (ms) from its checkpoint config, None when it has none."""
    interval = config.get("interval") if isinstance(config, dict) else None
    return int(interval) if interval else None


def _due(last_trigger_at: int | None, periodic_from: int | None, interval: int) -> int:
    """When a job's next periodic checkpoint falls due: one interval after the last trigger (or the attempt's
    start), and not before its subtasks all run (or their grace period is over)."""
    due = (last_trigger_at or 0) + interval
    return max(due, periodic_from) if periodic_from is not None else due


def _trigger_deadline(event) -> int | None:
    """When the checkpoint a trigger event issued can next need the scheduler: its switch to unaligned (the trigger
    plus its alignment timeout, as `trigger` sets `switch_at`) or its timeout, whichever comes first. None for any
    other event, or a trigger that does not say."""
    if getattr(event, "type", None) != EventType.checkpoint_triggered:
        return None
    data = event.data
    timeout_at, at, alignment_timeout = data.get("timeout_at"), data.get("trigger_timestamp"), data.get("alignment_timeout")
    if not isinstance(timeout_at, int) or not isinstance(at, int):
        return None
    if alignment_timeout:
        if not isinstance(alignment_timeout, int):
            return None
        return min(timeout_at, at + alignment_timeout)
    return timeout_at
