"""The scheduler inside the service: periodic triggers, checkpoint timeouts, alignment-timeout switches,
and sweeps (released blobs, old events). Safe with several replicas: each action re-checks its condition
under the job row lock, taken with SKIP LOCKED, so it happens once."""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy import select

from app.db.models import CheckpointRow, JobRow
from app.domain.checkpoints import ACTIVE, abort_checkpoint, pending_ids, trigger, trigger_refusal
from app.domain.context import Context, lock_job, now_ms
from app.domain.lifecycle import PENDING, AbortReason
from app.errors import DomainError
from app.events import emit, trim_log
from client.models import CheckpointConfig, EventType

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.tick = ctx.settings.scheduler_tick
        self._task: asyncio.Task[None] | None = None
        self._passes = 0

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="overtake-scheduler")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        while True:
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep scheduling
                log.exception("scheduler pass failed")
            await asyncio.sleep(self.tick)

    async def run_once(self) -> None:
        now = now_ms()
        await self._expire_and_switch(now)
        await self._periodic_triggers(now)
        self._passes += 1
        if self._passes % max(1, int(10 / self.tick)) == 0:
            await self.ctx.sweep_released_blobs()
            await self._trim_events()

    async def _expire_and_switch(self, now: int) -> None:
        async with self.ctx.tx(readonly=True) as s:
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
                        {"checkpoint_id": cp.id, "attempt": cp.attempt, "alignment_timeout": cp.alignment_timeout},
                        now,
                    )

    async def _periodic_triggers(self, now: int) -> None:
        async with self.ctx.tx(readonly=True) as s:
            jobs = (
                await s.execute(
                    select(JobRow.id, JobRow.config, JobRow.last_trigger_at).where(JobRow.status.in_(ACTIVE))
                )
            ).all()
        for job_id, config, last in jobs:
            interval = config.get("interval")
            if not interval or (last is not None and now < last + interval):
                continue
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

    async def _trim_events(self) -> None:
        keep = self.ctx.settings.event_retention
        async with self.ctx.tx(readonly=True) as s:
            jobs = (await s.execute(select(JobRow.id, JobRow.event_seq).where(JobRow.event_seq > keep))).all()
        for job_id, seq in jobs:
            async with self.ctx.tx() as s:
                await trim_log(s, job_id, seq - keep)
