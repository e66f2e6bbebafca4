"""The floor of an unaligned checkpoint's ack path, without any pipeline.

What every subtask does after its barrier, done by N threads at once against the same coordinator: send the
operator-state blob, a channel-state blob of realistic size and the ack in one request (``acks/with-state``,
what the runtime's ``AckWorker`` does). The time until all N acked is the shortest end-to-end checkpoint duration
N subtasks can reach on this machine and coordinator, whatever the barriers do. Rounds alternate with the
three-request path (upload, upload, ack: what the runtime did before), so both are measured in the same run.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field


@dataclass
class AckPathStats:
    subtasks: int
    rounds: int
    channel_blob_bytes: int
    all_acked_ms: list[float] = field(default_factory=list)
    """One request per subtask (blobs and ack): until all N acked."""
    operator_upload_ms: list[float] = field(default_factory=list)
    channel_upload_ms: list[float] = field(default_factory=list)
    ack_ms: list[float] = field(default_factory=list)
    three_requests_ms: list[float] = field(default_factory=list)
    """Two uploads and an ack per subtask: until all N acked."""

    @staticmethod
    def _p50(xs: list[float]) -> float | None:
        return float(statistics.median(xs)) if xs else None

    @property
    def p50(self) -> float | None:
        return self._p50(self.all_acked_ms)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(p50=self.p50, operator_upload_p50=self._p50(self.operator_upload_ms),
                 channel_upload_p50=self._p50(self.channel_upload_ms), ack_p50=self._p50(self.ack_ms),
                 three_requests_p50=self._p50(self.three_requests_ms))
        return d


def measure(url: str, subtasks: int, rounds: int, channel_blob_bytes: int, pause: float = 0.3) -> AckPathStats:
    """``rounds`` checkpoints of each path (alternating) of a fresh job with ``subtasks`` subtasks, each subtask
    acked by its own thread."""
    from client.sync import OvertakeClient

    st = AckPathStats(subtasks, rounds, channel_blob_bytes)
    with OvertakeClient(url) as admin:
        job = admin.create_job({
            "name": f"ack-path-{subtasks}-{int(time.time())}",
            "graph": {"vertices": [{"id": "v", "parallelism": subtasks}]},
            "checkpoint": {"policy": "unaligned", "retained": 1, "timeout": 600_000},
        })
        attempt = admin.start_attempt(job.id)
        clients = [OvertakeClient(url, attempt.task_token) for _ in range(subtasks)]
        channel = os.urandom(channel_blob_bytes)
        operator = os.urandom(2048)
        lock = threading.Lock()
        try:
            for r in range(2 * rounds):
                cp = admin.trigger_checkpoint(job.id).id
                combined = r % 2 == 0

                def one(i: int, cp: int = cp, r: int = r, combined: bool = combined) -> None:
                    c = clients[i]
                    tag = r.to_bytes(4, "little") + i.to_bytes(4, "little")
                    head = {"attempt": attempt.attempt, "vertex": "v", "subtask_index": i}
                    if combined:
                        c.ack_with_state(job.id, cp, {**head, "metrics": {"unaligned": True}},
                                         operator_state=operator + tag, channel_state=channel + tag)
                        return
                    a = time.perf_counter()
                    ho = c.upload_blob(job.id, cp, attempt=attempt.attempt, vertex="v", subtask_index=i,
                                       kind="operator", data=operator + tag)
                    b = time.perf_counter()
                    hc = c.upload_blob(job.id, cp, attempt=attempt.attempt, vertex="v", subtask_index=i,
                                       kind="channel", data=channel + tag)
                    d = time.perf_counter()
                    c.ack(job.id, cp, {
                        **head,
                        "operator_state": {"blob_id": ho.blob_id, "sha256": ho.sha256, "size": ho.size},
                        "channel_state": {"blob_id": hc.blob_id, "sha256": hc.sha256, "size": hc.size},
                        "metrics": {"unaligned": True, "persisted_data": hc.size},
                    })
                    e = time.perf_counter()
                    with lock:
                        st.operator_upload_ms.append((b - a) * 1000)
                        st.channel_upload_ms.append((d - b) * 1000)
                        st.ack_ms.append((e - d) * 1000)

                t0 = time.perf_counter()
                threads = [threading.Thread(target=one, args=(i,)) for i in range(subtasks)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                (st.all_acked_ms if combined else st.three_requests_ms).append((time.perf_counter() - t0) * 1000)
                time.sleep(pause)
        finally:
            for c in clients:
                c.close()
            try:
                admin.finish_job(job.id, "FINISHED", None, attempt=attempt.attempt)
            except Exception:  # noqa: BLE001 - bookkeeping only
                pass
    return st
