"""A hypothesis state machine over the real coordinator (in-process, real SQLite): random triggers, acks,
duplicate and conflicting acks, declines, timeouts, new attempts and coordinator restarts.

Invariants: ids strictly increase; at most max_concurrent checkpoints (not savepoints) pending; a completed
checkpoint has exactly one ack per subtask of its attempt; nothing leaves COMPLETED or ABORTED; no blob of a
retained checkpoint (or savepoint) is deleted.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import tempfile
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from sqlalchemy import func, select

from app.blobstore import upload_key
from app.db.models import AckRow
from app.domain.context import now_ms
from app.main import create_app
from app.settings import Settings

SUBTASKS = [("src", 0), ("src", 1), ("agg", 0)]
MAX_CONCURRENT = 2


class CoordinatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = Path(tempfile.mkdtemp(prefix="overtake-stateful-"))
        self.settings = Settings(
            data_dir=self.dir,
            scheduler_enabled=False,
            log_json=False,
            log_level="ERROR",
            verify_blobs_on_restore=True,
        )
        self._open()
        body = {
            "name": "stateful",
            "graph": {
                "vertices": [{"id": "src", "parallelism": 2}, {"id": "agg", "parallelism": 1, "keyed": True}],
                "edges": [{"source": "src", "target": "agg", "partitioning": "hash"}],
            },
            "checkpoint": {
                "max_concurrent": MAX_CONCURRENT,
                "retained": 2,
                "tolerable_failures": 1000,
                "policy": "unaligned",
            },
        }
        self.job = self.call("post", "/api/v1/jobs", json=body).json()["id"]
        self.attempt = self.call("post", f"/api/v1/jobs/{self.job}/attempts", json={}).json()["attempt"]
        self.last_id = 0
        self.status: dict[int, str] = {}  # checkpoint id -> last seen status
        self.acks: dict[int, dict[tuple[str, int], dict]] = {}  # what we sent and got 200 for
        self.blobs: dict[int, str] = {}  # checkpoint id -> operator blob of agg[0]

    # ------------------------------------------------------------------ plumbing
    def _open(self) -> None:
        self.app = create_app(self.settings)
        self.lifespan = self.app.router.lifespan_context(self.app)
        self.loop.run_until_complete(self.lifespan.__aenter__())
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://c")

    def _close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.run_until_complete(self.lifespan.__aexit__(None, None, None))

    def call(self, method: str, path: str, **kw) -> httpx.Response:
        return self.loop.run_until_complete(getattr(self.client, method)(path, **kw))

    def teardown(self) -> None:
        self._close()
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def pending(self) -> list[int]:
        return [i for i, s in self.status.items() if s == "PENDING"]

    def refresh(self) -> dict[int, dict]:
        page = self.call("get", f"/api/v1/jobs/{self.job}/checkpoints", params={"limit": 1000}).json()[
            "items"
        ]
        out = {c["id"]: c for c in page}
        for i, c in out.items():
            before = self.status.get(i)
            if before in ("COMPLETED", "ABORTED"):
                assert c["status"] == before, f"checkpoint {i} left {before} for {c['status']}"
            self.status[i] = c["status"]
        return out

    # ------------------------------------------------------------------ rules
    @rule(savepoint=st.booleans())
    def trigger(self, savepoint: bool) -> None:
        path = "savepoints" if savepoint else "checkpoints"
        r = self.call("post", f"/api/v1/jobs/{self.job}/{path}", json={})
        if r.status_code == 201:
            cp = r.json()
            assert cp["id"] > self.last_id, "checkpoint ids must strictly increase"
            self.last_id = cp["id"]
            self.status[cp["id"]] = "PENDING"
        else:
            assert r.status_code == 409 and "max_concurrent" in r.json()["error"]["message"]

    @precondition(lambda self: self.status)
    @rule(data=st.data(), with_state=st.booleans())
    def ack(self, data, with_state: bool) -> None:
        cp = data.draw(st.sampled_from(sorted(self.status)))
        vertex, index = data.draw(st.sampled_from(SUBTASKS))
        body = {
            "attempt": self.attempt,
            "vertex": vertex,
            "subtask_index": index,
            "metrics": {"sync_duration": 1},
        }
        if with_state and (vertex, index) == ("agg", 0) and self.status[cp] == "PENDING":
            payload = f"state {cp}".encode()
            up = self.call(
                "post",
                f"/api/v1/jobs/{self.job}/checkpoints/{cp}/blobs",
                params={"attempt": self.attempt, "vertex": "agg", "subtask_index": 0, "kind": "operator"},
                content=payload,
                headers={"X-Overtake-Sha256": hashlib.sha256(payload).hexdigest()},
            )
            if up.status_code in (200, 201):
                info = up.json()
                body["operator_state"] = {k: info[k] for k in ("blob_id", "sha256", "size")}
        r = self.call("post", f"/api/v1/jobs/{self.job}/checkpoints/{cp}/acks", json=body)
        sent = self.acks.setdefault(cp, {})
        key = (vertex, index)
        if r.status_code == 200:
            if key in sent:
                assert r.json()["duplicate"] == (sent[key] == body)
            else:
                sent[key] = body
                if "operator_state" in body:
                    self.blobs[cp] = body["operator_state"]["blob_id"]
        else:
            assert r.status_code in (409, 422), r.text

    @precondition(lambda self: any(self.acks.values()))
    @rule(data=st.data())
    def duplicate_or_conflicting_ack(self, data) -> None:
        cp = data.draw(st.sampled_from([c for c, a in self.acks.items() if a]))
        key = data.draw(st.sampled_from(sorted(self.acks[cp])))
        body = dict(self.acks[cp][key])
        conflicting = data.draw(st.booleans())
        if conflicting:
            body["metrics"] = {"sync_duration": 999}
        r = self.call("post", f"/api/v1/jobs/{self.job}/checkpoints/{cp}/acks", json=body)
        if conflicting:
            assert r.status_code == 409
        else:
            assert r.status_code == 200 and r.json()["duplicate"] is True

    @precondition(lambda self: self.pending())
    @rule(data=st.data())
    def decline(self, data) -> None:
        cp = data.draw(st.sampled_from(self.pending()))
        r = self.call(
            "post",
            f"/api/v1/jobs/{self.job}/checkpoints/{cp}/declines",
            json={"attempt": self.attempt, "vertex": "src", "subtask_index": 0, "reason": "random decline"},
        )
        assert r.status_code in (200, 409)

    @precondition(lambda self: self.pending())
    @rule()
    def timeout(self) -> None:
        self.loop.run_until_complete(self.app.state.scheduler._expire_and_switch(now_ms() + 10**9))

    @rule()
    def new_attempt(self) -> None:
        r = self.call("post", f"/api/v1/jobs/{self.job}/attempts", json={})
        assert r.status_code == 201, r.text
        self.attempt = r.json()["attempt"]

    @rule()
    def restart_coordinator(self) -> None:
        self._close()
        self._open()

    # ------------------------------------------------------------------ invariants
    @invariant()
    def invariants_hold(self) -> None:
        cps = self.refresh()
        pending = [c for c in cps.values() if c["status"] == "PENDING" and not c["is_savepoint"]]
        assert len(pending) <= MAX_CONCURRENT
        ids = sorted(cps)
        assert ids == list(range(1, len(ids) + 1))  # no id skipped or reused
        for c in cps.values():
            if c["status"] == "COMPLETED":
                assert c["num_acknowledged_subtasks"] == c["num_subtasks"] == len(SUBTASKS)
                rows = self.loop.run_until_complete(self._acks_of(c["id"]))
                assert rows == {(v, i, c["attempt"]) for v, i in SUBTASKS}
        for cp_id, blob_id in self.blobs.items():
            c = cps[cp_id]
            if c["status"] == "COMPLETED" and not c["discarded"]:
                key = upload_key(self.job, cp_id, blob_id)
                size = self.loop.run_until_complete(self.app.state.ctx.store.size(key))
                assert size is not None, f"blob of retained checkpoint {cp_id} was deleted"

    async def _acks_of(self, cp_id: int) -> set:
        async with self.app.state.ctx.tx(readonly=True) as s:
            rows = (
                await s.execute(
                    select(AckRow.vertex, AckRow.subtask_index, AckRow.attempt).where(
                        AckRow.job_id == self.job, AckRow.checkpoint_id == cp_id
                    )
                )
            ).all()
            n = (
                await s.execute(
                    select(func.count())
                    .select_from(AckRow)
                    .where(AckRow.checkpoint_id == cp_id, AckRow.job_id == self.job)
                )
            ).scalar_one()
        assert n == len(rows)
        return {tuple(r) for r in rows}


@pytest.mark.slow
def test_lifecycle_state_machine():
    run = CoordinatorMachine.TestCase
    run.settings = settings(
        max_examples=25, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
    )
    run().runTest()
