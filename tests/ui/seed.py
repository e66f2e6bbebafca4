"""Real checkpoints for the UI tests, made through the API: jobs, an attempt, triggers, blob uploads and acks.

The channel-state blobs are laid out as the runtime lays them out (``spark_plugin.channel_state``): per channel,
``[u32 length][buffer]`` repeated, each buffer ``[u32 length][pickle]`` repeated.
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
import pickle
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import httpx

_LEN = struct.Struct("<I")

GRAPH = {
    "vertices": [
        {"id": "source", "parallelism": 2, "kind": "source"},
        {"id": "count", "parallelism": 3, "keyed": True},
        {"id": "sink", "parallelism": 1, "kind": "sink"},
    ],
    "edges": [
        {"source": "source", "target": "count", "partitioning": "hash"},
        {"source": "count", "target": "sink", "partitioning": "rebalance"},
    ],
}


def frame(records: list) -> bytes:
    """One buffer: records framed as the runtime frames them."""
    out = []
    for r in records:
        data = pickle.dumps(r, pickle.HIGHEST_PROTOCOL)
        out += [_LEN.pack(len(data)), data]
    return b"".join(out)


def channel_blob(channels: list[tuple[str, str, str, int, str, list[list]]]) -> tuple[bytes, list[dict]]:
    """A channel-state blob and its segments; channels are (name, direction, peer, peer index, partitioning, buffers)."""
    parts, segments, offset = [], [], 0
    for name, direction, peer, peer_index, partitioning, buffers in channels:
        start, records = offset, 0
        for records_of_buffer in buffers:
            buf = frame(records_of_buffer)
            parts += [_LEN.pack(len(buf)), buf]
            offset += _LEN.size + len(buf)
            records += len(records_of_buffer)
        segments.append(
            {
                "channel": name,
                "direction": direction,
                "offset": start,
                "length": offset - start,
                "buffer_count": len(buffers),
                "record_count": records,
                "peer_vertex": peer,
                "peer_subtask": peer_index,
                "partitioning": partitioning,
            }
        )
    return b"".join(parts), segments


def order(n: int) -> tuple:
    when = datetime.datetime(2026, 11, 21, 12, 0, n % 60, tzinfo=datetime.timezone.utc)
    return (f"order-{n}", n % 7, decimal.Decimal(f"{n}.25"), when)


@dataclass
class Seeded:
    url: str
    orders: int
    idle: int
    long_history: int | None
    task_token: str
    unaligned_checkpoint: int = 0
    savepoint: int = 0
    declined: int = 0
    completed: list[int] = field(default_factory=list)


class Seeder:
    def __init__(self, url: str, admin_token: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=30)
        self.url = url

    def close(self) -> None:
        self.http.close()

    def _ok(self, r: httpx.Response) -> dict:
        assert r.status_code < 300, f"{r.request.method} {r.request.url}: {r.status_code} {r.text}"
        return r.json()

    def job(self, name: str, graph: dict = GRAPH, **checkpoint) -> dict:
        config = {"interval": None, "policy": "aligned_then_unaligned", "alignment_timeout": 50, **checkpoint}
        return self._ok(
            self.http.post("/api/v1/jobs", json={"name": name, "graph": graph, "checkpoint": config})
        )

    def attempt(self, job_id: int) -> str:
        return self._ok(self.http.post(f"/api/v1/jobs/{job_id}/attempts", json={"restore_latest": False}))[
            "task_token"
        ]

    def trigger(self, job_id: int, savepoint: bool = False, policy: str | None = None) -> int:
        """A checkpoint (with `policy` instead of the job's, as the coordinator's type shows it), or a savepoint."""
        path = f"/api/v1/jobs/{job_id}/{'savepoints' if savepoint else 'checkpoints'}"
        return self._ok(self.http.post(path, json={"policy": policy} if policy else {}))["id"]

    def upload(self, job_id: int, cp: int, vertex: str, index: int, kind: str, data: bytes) -> dict:
        return self._ok(
            self.http.post(
                f"/api/v1/jobs/{job_id}/checkpoints/{cp}/blobs",
                params={"attempt": 1, "vertex": vertex, "subtask_index": index, "kind": kind},
                content=data,
                headers={"X-Overtake-Sha256": hashlib.sha256(data).hexdigest()},
            )
        )

    def ack(
        self, job_id: int, cp: int, vertex: str, index: int, unaligned: bool, step: int, delay_ms: int
    ) -> None:
        """Upload this subtask's state (and channel state when unaligned), then ack with metrics."""
        state = f"{vertex}[{index}] state at checkpoint {cp}".encode() * (20 + 10 * index)
        op = self.upload(job_id, cp, vertex, index, "operator", state)
        ack: dict = {
            "attempt": 1,
            "vertex": vertex,
            "subtask_index": index,
            "operator_state": {k: op[k] for k in ("blob_id", "sha256", "size")},
            "metrics": {
                "sync_duration": 2 + index,
                "async_duration": 5 + 3 * index + step % 4,
                "alignment_duration": 0 if unaligned else 10 + 7 * index,
                "start_delay": 3 + 4 * index + (step % 3) * 5,
                "processed_data": 4096 * (index + 1),
                "persisted_data": 0,
                "unaligned": unaligned,
            },
        }
        if unaligned and vertex == "count":
            n = 3 + index * 4 + step
            channels = [
                (
                    f"in:source[{u}]->count[{index}]",
                    "input",
                    "source",
                    u,
                    "hash",
                    [
                        [order(100 * u + i) for i in range(n)],
                        [order(100 * u + n + i) for i in range(2)] + [{"late": True, "tags": {"a", "b"}}],
                    ],
                )
                for u in range(2)
            ]
            channels.append(
                (
                    f"out:count[{index}]->sink[0]",
                    "output",
                    "sink",
                    0,
                    "rebalance",
                    [[("count", index, n), OrderedDict(a=1)]],
                )
            )
            data, segments = channel_blob(channels)
            ch = self.upload(job_id, cp, vertex, index, "channel", data)
            ack["channel_state"] = {k: ch[k] for k in ("blob_id", "sha256", "size")}
            ack["channel_segments"] = segments
            # as the runtime counts it: the buffers' bytes, without the 4-byte length stored before each
            ack["metrics"]["persisted_data"] = len(data) - _LEN.size * sum(g["buffer_count"] for g in segments)
        if delay_ms:
            time.sleep(delay_ms / 1000)
        self._ok(self.http.post(f"/api/v1/jobs/{job_id}/checkpoints/{cp}/acks", json=ack))

    def checkpoint(
        self, job_id: int, graph: dict, unaligned: bool, step: int, savepoint: bool = False
    ) -> int:
        cp = self.trigger(job_id, savepoint, None if savepoint else "unaligned" if unaligned else "aligned")
        for v in graph["vertices"]:
            for i in range(v["parallelism"]):
                self.ack(job_id, cp, v["id"], i, unaligned and not savepoint, step, delay_ms=(step * 7) % 23)
        return cp

    def decline(self, job_id: int, cp: int, reason: str) -> None:
        body = {"attempt": 1, "vertex": "count", "subtask_index": 1, "reason": reason}
        self._ok(self.http.post(f"/api/v1/jobs/{job_id}/checkpoints/{cp}/declines", json=body))

    def long_history(self, name: str, count: int) -> int:
        """A one-subtask job with ``count`` completed checkpoints (acked in one batch each)."""
        graph = {"vertices": [{"id": "only", "parallelism": 1, "kind": "source"}], "edges": []}
        job = self.job(name, graph, retained=1)
        self.attempt(job["id"])
        for step in range(count):
            cp = self.trigger(job["id"], policy="unaligned" if step % 2 == 1 else "aligned")
            ack = {
                "attempt": 1,
                "vertex": "only",
                "subtask_index": 0,
                "metrics": {"sync_duration": 1, "async_duration": step % 9, "unaligned": step % 2 == 1},
            }
            self._ok(self.http.post(f"/api/v1/jobs/{job['id']}/checkpoints/{cp}/acks", json=ack))
        return job["id"]


def seed(url: str, admin_token: str | None = None, long_history: int = 0) -> Seeded:
    """The UI tests' world: 'orders' with a dozen real checkpoints, 'idle' with none, and optionally a long one."""
    s = Seeder(url, admin_token)
    try:
        idle = s.job("idle")
        job = s.job("orders", retained=20, max_concurrent=2)
        token = s.attempt(job["id"])
        out = Seeded(url, job["id"], idle["id"], None, token)
        for step in range(10):
            unaligned = step % 3 != 0
            cp = s.checkpoint(job["id"], GRAPH, unaligned, step)
            out.completed.append(cp)
            if unaligned:
                out.unaligned_checkpoint = cp
            if step == 4:
                out.declined = s.trigger(job["id"])
                s.decline(job["id"], out.declined, "count[1] could not snapshot: state backend unavailable")
        out.savepoint = s.checkpoint(job["id"], GRAPH, False, 10, savepoint=True)
        out.completed.append(out.savepoint)
        # the latest checkpoint is unaligned, so the in-flight page of the newest one has data
        out.unaligned_checkpoint = s.checkpoint(job["id"], GRAPH, True, 11)
        out.completed.append(out.unaligned_checkpoint)
        if long_history:
            out.long_history = s.long_history("long-history", long_history)
        return out
    finally:
        s.close()
