"""The floor of an unaligned checkpoint's ack path, without any pipeline.

What every subtask does after its barrier, done by N processes at once against the same coordinator, in alternating
rounds of the two paths state can take:

- **direct** (the default, ``OVERTAKE_STATE_WRITES=direct``): the subtask writes its operator and channel state as one
  object under the checkpoint's prefix in the blob store itself (the runtime's ``StateWriter``: durable, fsynced),
  then sends an ack naming it; the coordinator stats the object and records the ack;
- **direct, through the host's ack relay** (the runtime's default, ``NetworkConfig.ack_relay``): the same writes,
  and the acks go through one :class:`~spark_plugin.task.ack_relay.AckRelay` (the N processes play the subtasks of one
  host; the relay runs in the measuring one), which sends those that wait together as one batch request;
- **through the coordinator**: blobs and ack in one request (``acks/with-state``), the coordinator storing them.

The time until all N acked is the shortest end-to-end checkpoint duration N subtasks can reach on this machine and
coordinator, whatever the barriers do. Each subtask is a process of its own, as Spark runs each task in a Python
worker of its own (as threads of one process they would take turns at one interpreter lock).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.control import close_job, one_vertex_job


@dataclass
class AckPathStats:
    subtasks: int
    rounds: int
    channel_blob_bytes: int
    all_acked_ms: list[float] = field(default_factory=list)
    """Through the coordinator, one request per subtask (blobs and ack): until all N acked."""
    direct_ms: list[float] = field(default_factory=list)
    """Written into the store by each subtask, then an ack request of its own naming it: until all N acked."""
    relay_ms: list[float] = field(default_factory=list)
    """Written into the store by each subtask, then acked through the host's relay: until all N acked."""
    relay_requests: int = 0
    """Ack requests the relay sent over all its rounds (N per round without it)."""
    write_ms: list[float] = field(default_factory=list)
    """Direct path: each subtask's durable write of its object."""
    ack_ms: list[float] = field(default_factory=list)
    """Direct path: each subtask's ack request."""
    relay_control_ms: list[float] = field(default_factory=list)
    """Through the relay: from the last subtask's state being durable to all N acked (the control path alone)."""
    direct_control_ms: list[float] = field(default_factory=list)
    """The same with an ack request per subtask."""
    relay_ack_ms: list[float] = field(default_factory=list)
    """Direct path through the relay: each subtask's ack, until the relay answered it."""
    relay_write_span_ms: list[float] = field(default_factory=list)
    """Through the relay: from the round's start to the last subtask's state being durable (all N writes)."""
    relay_request_ms: list[float] = field(default_factory=list)
    """Through the relay: each round's batch requests, from sending to the coordinator's answer (mean per request)."""
    relay_commit_ms: list[float] = field(default_factory=list)
    """Through the relay: each round's ack transactions in the coordinator (mean per transaction;
    ``overtake_ack_commit_seconds``)."""
    relay_commits: int = 0
    """Ack transactions the coordinator ran over the relay's rounds."""
    disk_floor_ms: list[float] = field(default_factory=list)
    """Just before each relay round: the round's bytes (every subtask's object) written by one thread as one file in
    the store's directory, with one fsync of the file and one of its directory: what this disk allows for the
    round's writes, against ``relay_write_span_ms``."""
    commit_floor_ms: list[float] = field(default_factory=list)
    """Just before each relay round: one PostgreSQL transaction that writes one row and commits (its WAL flushed),
    on the coordinator's database: the least the transaction recording the acks can take on this machine."""
    request_floor_ms: list[float] = field(default_factory=list)
    """Just before each relay round: one request to the coordinator that does no database work (``GET /healthz``):
    the least the relay's request around that transaction can add."""

    @staticmethod
    def _p50(xs: list[float]) -> float | None:
        return float(statistics.median(xs)) if xs else None

    @property
    def p50(self) -> float | None:
        """Through the coordinator."""
        return self._p50(self.all_acked_ms)

    @property
    def direct_p50(self) -> float | None:
        return self._p50(self.direct_ms)

    @property
    def relay_p50(self) -> float | None:
        return self._p50(self.relay_ms)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(p50=self.p50, direct_p50=self.direct_p50, relay_p50=self.relay_p50, write_p50=self._p50(self.write_ms),
                 ack_p50=self._p50(self.ack_ms), relay_ack_p50=self._p50(self.relay_ack_ms),
                 relay_control_p50=self._p50(self.relay_control_ms), direct_control_p50=self._p50(self.direct_control_ms),
                 relay_write_span_p50=self._p50(self.relay_write_span_ms),
                 relay_request_p50=self._p50(self.relay_request_ms), relay_commit_p50=self._p50(self.relay_commit_ms),
                 disk_floor_p50=self._p50(self.disk_floor_ms), commit_floor_p50=self._p50(self.commit_floor_ms),
                 request_floor_p50=self._p50(self.request_floor_ms), floor_p50=self.floor_p50)
        return d

    @property
    def floor_p50(self) -> float | None:
        """The ack path's floor on this machine: the round's bytes made durable as one file, then one commit and one
        request, each at its p50 (nothing of the path's own work: what any implementation would pay)."""
        parts = [self._p50(xs) for xs in (self.disk_floor_ms, self.commit_floor_ms, self.request_floor_ms)]
        return None if any(p is None for p in parts) else sum(parts)


def _one_file(directory: Path, data: bytes) -> float:
    """Milliseconds to write ``data`` as one new file in ``directory`` and make it durable (one fsync of the file,
    one of the directory); the file is removed after."""
    path = directory / f".ack-path-floor-{os.getpid()}"
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    took = (time.perf_counter() - t0) * 1000
    path.unlink()
    return took


class _ControlFloor:
    """One committed one-row transaction on the coordinator's PostgreSQL database, and one request to the coordinator
    that does no database work, each timed on a connection kept open (as the coordinator's and the relay's are)."""

    TABLE = "overtake_bench_commit_floor"

    def __init__(self, url: str, db_url: str | None) -> None:
        import httpx

        self.http = httpx.Client(base_url=url, timeout=10.0)
        self.db = None
        if db_url is not None and db_url.startswith("postgresql"):
            import psycopg

            self.db = psycopg.connect(db_url.replace("+asyncpg", "", 1))
            self.db.execute(f"CREATE TABLE IF NOT EXISTS {self.TABLE} (n bigint)")
            self.db.commit()

    def commit_ms(self) -> float | None:
        if self.db is None:
            return None
        t0 = time.perf_counter()
        self.db.execute(f"INSERT INTO {self.TABLE} VALUES (1)")
        self.db.commit()
        return (time.perf_counter() - t0) * 1000

    def request_ms(self) -> float:
        t0 = time.perf_counter()
        self.http.get("/healthz").raise_for_status()
        return (time.perf_counter() - t0) * 1000

    def close(self) -> None:
        self.http.close()
        if self.db is not None:
            self.db.execute(f"DROP TABLE IF EXISTS {self.TABLE}")
            self.db.commit()
            self.db.close()


def _commit_totals(url: str) -> tuple[float, float]:
    """The coordinator's ack transactions so far: (seconds, count), from its Prometheus metrics."""
    import httpx

    total = {"overtake_ack_commit_seconds_sum": 0.0, "overtake_ack_commit_seconds_count": 0.0}
    for line in httpx.get(url.rstrip("/") + "/metrics", timeout=10.0).text.splitlines():
        name, _, value = line.partition(" ")
        if name in total:
            total[name] = float(value)
    return total["overtake_ack_commit_seconds_sum"], total["overtake_ack_commit_seconds_count"]


def _subtask(url: str, token: str, job_id: int, attempt: int, i: int, relay_port: int, blob_bytes: int,
             start: Any, conn: Any) -> None:
    """One subtask of :func:`measure`, in a process of its own (as Spark runs each task in a Python worker of its
    own): for each round the parent sends (round, checkpoint, write target or None, mode), it passes the round's
    barrier with the others, writes and acks as the mode says, and answers (started, durable, ended) from the
    system-wide monotonic clock; None ends it."""
    from benchmarks import processes
    from client.sync import OvertakeClient
    from contract.models import WriteTarget
    from spark_plugin.task.ack_relay import RelayReporter
    from spark_plugin.task.coordination import SubtaskIdentity
    from spark_plugin.task.state_store import StateWriter

    client = OvertakeClient(url, token)
    writer = StateWriter(f"v-{i}-a{attempt}.state")
    reporter = RelayReporter(client, SubtaskIdentity(job_id, attempt, "v", i), token=token)
    reporter.use_relay(("127.0.0.1", relay_port))
    channel, operator = os.urandom(blob_bytes), os.urandom(2048)
    head = {"attempt": attempt, "vertex": "v", "subtask_index": i}
    try:
        conn.send("ready")
        while (cmd := conn.recv()) is not None:
            r, cp, target, mode = cmd
            tag = r.to_bytes(4, "little") + i.to_bytes(4, "little")
            start.wait()
            a = time.perf_counter()
            if target is None:
                client.ack_with_state(job_id, cp, {**head, "metrics": {"unaligned": True}},
                                      operator_state=operator + tag, channel_state=channel + tag)
                conn.send((a, None, time.perf_counter()))
                continue
            written = writer.write(WriteTarget.model_validate(target), operator + tag, channel + tag)
            b = time.perf_counter()
            ack = {"written": written.model_dump(mode="json"),
                   "metrics": {"unaligned": True, "persisted_data": written.channel_size}}
            if mode == "relay":
                reporter.ack(cp, ack)
            else:
                client.ack(job_id, cp, {**head, **ack})
            conn.send((a, b, time.perf_counter()))
    except BaseException as exc:  # noqa: BLE001 - the measuring process raises it
        processes.failed(conn, f"subtask {i}", exc)
        raise
    finally:
        reporter.close()
        writer.close()
        client.close()


def measure(url: str, subtasks: int, rounds: int, channel_blob_bytes: int, pause: float = 0.3,
            db_url: str | None = None) -> AckPathStats:
    """``rounds`` checkpoints of each path (in turn) of a fresh job with ``subtasks`` subtasks, each subtask a
    process of its own (:func:`_subtask`; the host's relay runs in this one). The coordinator must hand out write
    targets (``OVERTAKE_STATE_WRITES=direct``). ``db_url``: the coordinator's PostgreSQL database, for the floor of
    a commit (``commit_floor_ms``)."""
    from benchmarks import processes
    from client.sync import OvertakeClient
    from contract.models import EventType
    from spark_plugin.task.ack_relay import AckRelay
    from spark_plugin.task.state_store import _file_path

    st = AckPathStats(subtasks, rounds, channel_blob_bytes)
    ctx = processes.context()
    with OvertakeClient(url) as admin:
        job, attempt = one_vertex_job(admin, "ack-path", subtasks)
        after = max((e.id for e in admin.event_history(job.id, limit=1000)), default=None)
        floor = _ControlFloor(url, db_url)
        relay = AckRelay(OvertakeClient(url, attempt.task_token), job.id, attempt.task_token)
        port = relay.start()
        start = ctx.Barrier(subtasks + 1, timeout=120)
        procs, conns = processes.start(ctx, _subtask, [(url, attempt.task_token, job.id, attempt.attempt, i, port,
                                                        channel_blob_bytes, start) for i in range(subtasks)])
        try:
            for c in conns:
                processes.answer(c, "subtask (starting)")
            for r in range(3 * rounds):
                cp = admin.trigger_checkpoint(job.id).id
                mode = ("direct", "relay", "coordinator")[r % 3]
                target = None
                if mode != "coordinator":
                    # read on from the last event seen: a run of many rounds outgrows one page of the job's events
                    for ev in admin.event_history(job.id, after=after, limit=1000):
                        after = ev.id
                        if ev.type == EventType.checkpoint_triggered and ev.data["checkpoint_id"] == cp:
                            target = ev.data.get("target")
                    if target is None:
                        raise RuntimeError(f"checkpoint {cp} has no write target: run the coordinator with "
                                           "OVERTAKE_STATE_WRITES=direct")
                if mode == "relay" and target is not None and target["url"].startswith("file://"):
                    size = subtasks * (channel_blob_bytes + 2048 + 8)
                    st.disk_floor_ms.append(_one_file(_file_path(target["url"]), os.urandom(size)))
                    commit = floor.commit_ms()
                    if commit is not None:
                        st.commit_floor_ms.append(commit)
                    st.request_floor_ms.append(floor.request_ms())
                    time.sleep(pause)
                commits_before, requests_before = _commit_totals(url), (relay.request_seconds, relay.requests)
                for c in conns:
                    c.send((r, cp, target, mode))
                start.wait()
                t0 = time.perf_counter()
                answers = [processes.answer(c, f"subtask (checkpoint {cp}, {mode})") for c in conns]
                end = max(e for _, _, e in answers)
                took = (end - t0) * 1000
                durable = [b for _, b, _ in answers if b is not None]
                if mode != "coordinator":
                    for a, b, e in answers:
                        st.write_ms.append((b - a) * 1000)
                        (st.relay_ack_ms if mode == "relay" else st.ack_ms).append((e - b) * 1000)
                    control = st.relay_control_ms if mode == "relay" else st.direct_control_ms
                    control.append((end - max(durable)) * 1000)
                {"direct": st.direct_ms, "relay": st.relay_ms, "coordinator": st.all_acked_ms}[mode].append(took)
                if mode == "relay":
                    seconds, count = (a - b for a, b in zip(_commit_totals(url), commits_before, strict=True))
                    if count:
                        st.relay_commit_ms.append(seconds / count * 1000)
                        st.relay_commits += int(count)
                    sent = relay.requests - requests_before[1]
                    if sent:
                        st.relay_request_ms.append((relay.request_seconds - requests_before[0]) / sent * 1000)
                    st.relay_write_span_ms.append((max(durable) - t0) * 1000)
                time.sleep(pause)
        finally:
            st.relay_requests = relay.requests
            for c in conns:
                try:
                    c.send(None)
                except OSError:
                    pass
            processes.stop(procs)
            relay.close()
            relay.client.close()
            floor.close()
            close_job(admin, job, attempt, [])
    return st
