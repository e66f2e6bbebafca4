"""The control path between the coordinator and its subtasks, without any pipeline: how fast a trigger reaches every
subtask, how fast N subtasks' acks are recorded.

Trigger delivery: N subscribers follow the job's event stream (what each subtask's ``SdkEvents`` does), the
benchmark triggers a checkpoint and every subscriber notes when the ``checkpoint.triggered`` event arrived. Two
figures per round: from sending the trigger request to the last subscriber's receipt (what a trigger costs end to
end, the request's own commit included), and from the trigger response to that receipt (the delivery after the
coordinator said it triggered; negative when events outrun the response).
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import asdict, dataclass, field

from contract.models import EventType


def _p50(xs: list[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def one_vertex_job(admin, name: str, subtasks: int):
    """A fresh job of one vertex with ``subtasks`` subtasks and its running attempt, for benchmarks that play the
    subtasks themselves."""
    job = admin.create_job({
        "name": f"{name}-{subtasks}-{int(time.time())}",
        "graph": {"vertices": [{"id": "v", "parallelism": subtasks}]},
        "checkpoint": {"policy": "unaligned", "retained": 1, "timeout": 600_000},
    })
    return job, admin.start_attempt(job.id)


def close_job(admin, job, attempt, clients) -> None:
    """Close the benchmark's clients and end its job (bookkeeping only: a failure here changes no figure)."""
    for c in clients:
        c.close()
    try:
        admin.finish_job(job.id, "FINISHED", None, attempt=attempt.attempt)
    except Exception:  # noqa: BLE001 - bookkeeping only
        pass


@dataclass
class TriggerDelivery:
    subscribers: int
    rounds: int
    to_last_ms: list[float] = field(default_factory=list)
    """Per round: trigger request sent -> the last subscriber received its event."""
    after_response_ms: list[float] = field(default_factory=list)
    """Per round: trigger response received -> the last subscriber received its event."""
    each_ms: list[float] = field(default_factory=list)
    """Every subscriber's receipt, from the trigger request."""

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(p50_to_last=_p50(self.to_last_ms), p50_after_response=_p50(self.after_response_ms),
                 p50_each=_p50(self.each_ms))
        return d


def trigger_delivery(url: str, subscribers: int = 8, rounds: int = 30, pause: float = 0.2,
                     timeout: float = 10.0) -> TriggerDelivery:
    """``rounds`` triggers of a fresh job whose ``subscribers`` follow its events (each on its own connection)."""
    from client.sync import OvertakeClient

    st = TriggerDelivery(subscribers, rounds)
    with OvertakeClient(url) as admin:
        job, attempt = one_vertex_job(admin, "trigger-delivery", subscribers)
        after = max((e.id for e in admin.event_history(job.id, limit=1000)), default=None)
        received: dict[int, list[float]] = {}
        cond = threading.Condition()
        clients = [OvertakeClient(url, attempt.task_token) for _ in range(subscribers)]

        def follow(c: OvertakeClient) -> None:
            try:
                for ev in c.events(job.id, after=after):
                    if ev.type == EventType.checkpoint_triggered:
                        now = time.perf_counter()
                        with cond:
                            received.setdefault(ev.data["checkpoint_id"], []).append(now)
                            cond.notify_all()
            except Exception:  # noqa: BLE001 - closing the client ends the stream
                return

        threads = [threading.Thread(target=follow, args=(c,), daemon=True) for c in clients]
        for t in threads:
            t.start()
        decliner = OvertakeClient(url, attempt.task_token)

        def done(cp: int) -> None:
            """Abort the round's checkpoint (the job allows one pending checkpoint)."""
            decliner.decline(job.id, cp, {"attempt": attempt.attempt, "vertex": "v", "subtask_index": 0,
                                          "reason": "benchmark round over"})

        try:
            # warm-up: the first trigger waits until every stream is connected and delivered it
            warm = admin.trigger_checkpoint(job.id).id
            with cond:
                if not cond.wait_for(lambda: len(received.get(warm, [])) >= subscribers, timeout * 3):
                    raise RuntimeError(f"only {len(received.get(warm, []))} of {subscribers} event streams delivered "
                                       f"the first trigger within {timeout * 3:.0f}s")
            done(warm)
            for _ in range(rounds):
                time.sleep(pause)
                t0 = time.perf_counter()
                cp = admin.trigger_checkpoint(job.id).id
                t1 = time.perf_counter()
                with cond:
                    if not cond.wait_for(lambda cp=cp: len(received.get(cp, [])) >= subscribers, timeout):
                        raise RuntimeError(f"checkpoint {cp}: {len(received.get(cp, []))} of {subscribers} "
                                           f"subscribers received its trigger within {timeout:.0f}s")
                    got = list(received[cp])
                done(cp)
                st.to_last_ms.append((max(got) - t0) * 1000)
                st.after_response_ms.append((max(got) - t1) * 1000)
                st.each_ms.extend((g - t0) * 1000 for g in got)
        finally:
            close_job(admin, job, attempt, [*clients, decliner])
    return st
