"""The scheduler inside the service: periodic triggers, checkpoint timeouts, alignment-timeout switches,
and sweeps (released blobs, old events). Safe with several replicas: each action re-checks its condition
under the job row lock, taken with SKIP LOCKED, so it happens once.

It does not poll the database every tick: each pass computes when the next thing falls due and sleeps
until then (at most `max_idle` seconds), or until an event (from this or another replica) wakes it."""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy import case, func, select

from app.db.models import CheckpointRow, JobRow
from app.domain.checkpoints import ACTIVE, abort_checkpoint, pending_ids, trigger, trigger_refusal
from app.domain.context import BackgroundWorker, Context, lock_job, now_ms
from app.domain.lifecycle import PENDING, AbortReason
from app.errors import DomainError
from app.events import emit, trim_log
from client.models import CheckpointConfig, EventType

log = logging.getLogger(__name__)
FAR = 2**62


class Scheduler(BackgroundWorker):
    name = "overtake-scheduler"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.tick = ctx.settings.scheduler_tick
        self.max_idle = 1.0
        self._wake = asyncio.Event()
        self._next_sweep = 0.0
        ctx.bus.add_listener(lambda _event: self._wake.set())

    async def _run(self) -> None:
        while True:
            next_due = now_ms() + self.max_idle * 1000
            self._wake.clear()
            try:
                next_due = await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep scheduling
                log.exception("scheduler pass failed")
            delay = min(self.max_idle, max(self.tick, (next_due - now_ms()) / 1000))
            # asyncio.wait, not wait_for: wait_for can swallow a cancellation that races a wake-up (Python < 3.12).
            waiter = asyncio.ensure_future(self._wake.wait())
            try:
                done, _ = await asyncio.wait({waiter}, timeout=delay)
            finally:
                waiter.cancel()
            if done:
                await asyncio.sleep(self.tick)  # let a burst of events settle into one pass

    async def run_once(self) -> int:
        """One pass; returns when (ms since the epoch) the next known deadline falls due."""
        now = now_ms()
        next_due = min(await self._expire_and_switch(now), await self._periodic_triggers(now))
        if time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + 10
            await self.ctx.sweep_released_blobs()
            await self._trim_events()
        return next_due

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
            async with self.ctx.tx() as s:
                job = await lock_job(s, job_id, skip_locked=True)
                if job is None:
                    continue  # another replica (or an ack batch) holds it; next pass
                cp = await s.get(CheckpointRow, (job_id, cp_id))
                if cp is None or cp.status != PENDING:
                    continue
                if cp.timeout_at <= now:
                    cfg = CheckpointConfig.model_validate(job.config)
                    await abort_checkpoint(
                        s,
                        job,
                        cp,
                        AbortReason.expired,
                        f"not acknowledged by all subtasks within timeout={cfg.timeout} ms "
                        f"({cp.num_acked} of {cp.num_subtasks} acked)",
                        now,
                    )
                elif cp.switch_at is not None and cp.switch_at <= now and cp.switched_ts is None:
                    cp.switched_ts = now
                    emit(
                        s,
                        job,
                        EventType.checkpoint_switch_to_unaligned,
                        {
                            "checkpoint_id": cp.id,
                            "attempt": cp.attempt,
                            "alignment_timeout": cp.alignment_timeout,
                        },
                        now,
                    )
        return min((t for t in upcoming if t is not None), default=FAR)

    async def _periodic_triggers(self, now: int) -> int:
        async with self.ctx.tx(readonly=True) as s:
            jobs = (
                await s.execute(
                    select(JobRow.id, JobRow.config, JobRow.last_trigger_at).where(JobRow.status.in_(ACTIVE))
                )
            ).all()
        next_due = FAR
        for job_id, config, last in jobs:
            interval = config.get("interval")
            if not interval:
                continue
            if last is not None and now < last + interval:
                next_due = min(next_due, last + interval)
                continue
            next_due = min(next_due, now + interval)
            async with self.ctx.tx() as s:
                job = await lock_job(s, job_id, skip_locked=True)
                if job is None or job.status not in ACTIVE:
                    continue
                # Re-check under the lock: another replica may have fired this one already.
                if job.last_trigger_at is not None and now < job.last_trigger_at + interval:
                    continue
                if trigger_refusal(job, await pending_ids(s, job.id), now, savepoint=False):
                    continue
                try:
                    await trigger(s, job, now)
                except DomainError as exc:
                    log.info("periodic trigger of job %s skipped: %s", job_id, exc.message)
        return next_due

    async def _trim_events(self) -> None:
        keep = self.ctx.settings.event_retention
        async with self.ctx.tx(readonly=True) as s:
            jobs = (await s.execute(select(JobRow.id, JobRow.event_seq).where(JobRow.event_seq > keep))).all()
        for job_id, seq in jobs:
            async with self.ctx.tx() as s:
                await trim_log(s, job_id, seq - keep)
