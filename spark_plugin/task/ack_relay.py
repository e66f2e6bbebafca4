"""One ack request per host, not per subtask: the host's ack relay.

Spark runs every subtask in its own Python worker, so without help every subtask sends its own ack request and the
coordinator pays a request's work (HTTP, the token, parsing, a transaction) per subtask. On each host one task of
the stage (the lowest partition on it) runs an :class:`AckRelay`: a thread serving a loopback TCP port. The
subtasks of that host (its own included) send it their acks through a :class:`RelayReporter`; the relay sends
whatever acks are waiting as one batch request per checkpoint (``…/acks/batch``), and while one is on its way the
next ones gather, so acks that finish together travel together. Each subtask gets its own ack's answer back, so
retries, refusals and a discarded checkpoint behave exactly as with a request of its own.

A relay is no new way to fail: the stage is a barrier stage, so the relay's task dying fails every task of the
stage anyway. Until then, a subtask that cannot reach its relay (or gets no answer from it within
``RELAY_WAIT``) acks on its own, directly, from then on. A relay takes acks only from a connection that
presented the attempt's task token first. The relay's task closes it only after every task of the stage sent
its last ack: after their loops the tasks pass a second barrier once each has drained its ack worker
(``spark_task.py``), so a checkpoint answered at the very end is relayed like every other.

**Live metrics** go the same way: a subtask hands its sample to the relay (no answer is awaited), the relay keeps
the newest of each subtask and sends what it holds as one request every ``METRICS_FLUSH`` seconds
(``…/attempts/{attempt}/metrics/batch``), on a thread and a client of its own so that a metrics request never
delays an ack. Each report keeps its subtask and the time the subtask measured it, so the live view shows every
subtask's own figures and age as before (a host of 16 subtasks sends one request a second, not 16). A subtask that
cannot reach its relay reports directly.

The wire: frames of a 4-byte big-endian length and a JSON object. A subtask sends ``{"token": ...}`` once, then
``{"id", "checkpoint_id", "ack"}`` per ack; the relay answers ``{"id", "status", "code", "message"}``, where
``status`` is the item's HTTP status, or 0 when the coordinator could not be reached. A metrics sample is
``{"metrics": {"vertex", "subtask_index", "timestamp", "metrics"}}``, unanswered.
"""

from __future__ import annotations

import hmac
import json
import logging
import queue
import socket
import struct
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from client.errors import Conflict, CoordinatorUnreachable, OvertakeError, error_for_status
from contract.models import SubtaskAck
from spark_plugin.task.coordination import CheckpointDiscarded, SdkReporter, SubtaskIdentity

log = logging.getLogger("overtake.relay")

RELAY_WAIT = 60.0
"""Seconds a subtask waits for its relay's answer before it acks on its own (the relay's own request is bounded by
the SDK's timeout and retries, well within this)."""

LINGER = 0.025
"""Seconds the relay waits for the next ack of a checkpoint after the last one arrived, while the host's other
subtasks have not acked it (it sends at once when every connected subtask acked). A checkpoint completes only once
every subtask acked, so holding the early acks until the host's last one costs the checkpoint nothing, and each
ack request the relay saves is a transaction less in the coordinator, which runs them one after another. A
pipeline several shuffles deep acks stage by stage, several milliseconds apart on a loaded host: a wait shorter
than those gaps splits the checkpoint's acks into requests, the last waiting for the one before it."""

HOLD_MAX = 0.1
"""Seconds the relay holds a checkpoint's first ack at most, however closely the others follow (a subtask of the
host that does not ack soon, e.g. one aligning barriers under backpressure, holds the others no longer)."""

METRICS_FLUSH = 1.0
"""Seconds between two metrics batches of a relay: the subtasks' sampling interval, so each subtask's figures reach
the coordinator at most about one interval later than they would directly (every report keeps its own time)."""

MAX_FRAME = 16 << 20
_LEN = struct.Struct(">I")


def _send_frame(sock: socket.socket, obj: dict) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    sock.sendall(_LEN.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the ack relay's connection closed")
        buf += chunk
    return bytes(buf)


def _recv_frame(sock: socket.socket) -> dict:
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if n > MAX_FRAME:
        raise ConnectionError(f"an ack relay frame of {n} bytes is larger than {MAX_FRAME}")
    return json.loads(_recv_exact(sock, n))


@dataclass
class _Pending:
    conn: _Connection
    id: int
    checkpoint_id: int
    ack: dict[str, Any]


class _Connection:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()

    def answer(self, obj: dict) -> None:
        try:
            with self.lock:
                _send_frame(self.sock, obj)
        except OSError:
            pass  # the subtask went away; it acks on its own if it is still there


class AckRelay:
    """The host's relay: takes acks over loopback from the subtasks of this host and sends them to the coordinator
    in batches. ``client`` is an SDK client with the attempt's task token; ``token`` what subtasks must present."""

    def __init__(self, client: Any, job_id: int, token: str | None, attempt: int | None = None,
                 metrics_client: Any | None = None, metrics_flush: float = METRICS_FLUSH) -> None:
        self.client = client
        self.job_id = job_id
        self.token = token or ""
        self.attempt = attempt
        self.metrics_client = metrics_client
        """Sends the metrics batches (None: the relay takes no metrics; its subtasks report directly)."""
        self.metrics_flush = metrics_flush
        self.metrics_requests = 0
        self.metrics_reports = 0
        """Metrics batch requests sent, and the reports in them (for tests and benchmarks)."""
        self._metrics: dict[tuple[str, int], dict[str, Any]] = {}
        self._metrics_lock = threading.Lock()
        self._metrics_thread: threading.Thread | None = None
        self.requests = 0
        """Batch requests sent (for tests and benchmarks)."""
        self.acks = 0
        self.request_seconds = 0.0
        """Time spent in the batch requests, from sending each to its answer (for benchmarks)."""
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._relayed: dict[int, int] = {}  # checkpoint -> acks relayed for it so far
        self._server: socket.socket | None = None
        self._closed = threading.Event()
        self._connections: list[_Connection] = []
        self._lock = threading.Lock()

    @property
    def queued(self) -> int:
        """Acks received and not yet on their way."""
        return self._queue.qsize()

    def start(self, host: str = "127.0.0.1") -> int:
        """Listen (on loopback) and serve; returns the port."""
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((host, 0))
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, name="overtake-ack-relay-accept", daemon=True).start()
        threading.Thread(target=self._send, name="overtake-ack-relay", daemon=True).start()
        if self.takes_metrics:
            self._metrics_thread = threading.Thread(target=self._send_metrics, name="overtake-metrics-relay",
                                                    daemon=True)
            self._metrics_thread.start()
        return server.getsockname()[1]

    @property
    def takes_metrics(self) -> bool:
        return self.metrics_client is not None and self.attempt is not None

    def _offer_metrics(self, report: dict[str, Any]) -> None:
        key = (str(report["vertex"]), int(report["subtask_index"]))
        with self._metrics_lock:
            held = self._metrics.get(key)
            if held is None or int(held["timestamp"]) <= int(report["timestamp"]):
                self._metrics[key] = report

    def _send_metrics(self) -> None:
        while not self._closed.wait(self.metrics_flush):
            self._flush_metrics()
        self._flush_metrics()  # what the subtasks sent last (e.g. a replay's end), once, within the client's timeout

    def _flush_metrics(self) -> None:
        with self._metrics_lock:
            reports, self._metrics = list(self._metrics.values()), {}
        if not reports:
            return
        try:
            result = self.metrics_client.report_metrics_batch(self.job_id, self.attempt, reports)
        except Exception as e:  # noqa: BLE001 - a metrics report is never worth failing anything; the next one comes
            log.debug("relayed live metrics not sent (%s: %s)", type(e).__name__, e)
            return
        self.metrics_requests += 1
        self.metrics_reports += len(reports)
        for item in result.items:
            if item.status_code >= 300:
                log.debug("relayed live metrics of %s[%d] refused: %s", item.vertex, item.subtask_index, item.error)

    def close(self) -> None:
        """Stop taking acks; subtasks whose ack was not answered yet ack on their own."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._queue.put(None)
        if self._server is not None:
            try:
                self._server.close()
            except OSError:
                pass
        with self._lock:
            connections = list(self._connections)
        for c in connections:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
                c.sock.close()
            except OSError:
                pass
        if self._metrics_thread is not None:
            # its last flush, bounded by the metrics client's timeout: the client is closed after this returns
            self._metrics_thread.join(5.0)

    def _accept(self) -> None:
        assert self._server is not None
        while not self._closed.is_set():
            try:
                sock, _ = self._server.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._read, args=(sock,), name="overtake-ack-relay-conn", daemon=True).start()

    def _read(self, sock: socket.socket) -> None:
        conn = _Connection(sock)
        try:
            sock.settimeout(10.0)
            hello = _recv_frame(sock)
            if not hmac.compare_digest(str(hello.get("token") or ""), self.token):
                conn.answer({"id": None, "status": 401, "code": "unauthorized",
                             "message": "the ack relay takes acks only with this attempt's task token"})
                sock.close()
                return
            sock.settimeout(None)
            with self._lock:
                self._connections.append(conn)
            conn.answer({"id": None, "status": 200, "metrics": self.takes_metrics})
            while not self._closed.is_set():
                frame = _recv_frame(sock)
                if "metrics" in frame:
                    if self.takes_metrics:
                        self._offer_metrics(frame["metrics"])
                    continue
                self._queue.put(_Pending(conn, int(frame["id"]), int(frame["checkpoint_id"]), frame["ack"]))
        except (OSError, ConnectionError, ValueError, KeyError, TypeError):
            pass
        finally:
            with self._lock:
                if conn in self._connections:
                    self._connections.remove(conn)
            try:
                sock.close()
            except OSError:
                pass

    def _send(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            waiting = [first]
            # everything that gathered while the last batch was on its way, and what else arrives for this
            # checkpoint until every connected subtask acked it, or no ack of it came for LINGER, or HOLD_MAX passed
            with self._lock:
                expected = len(self._connections)
            now = time.monotonic()
            latest = now + HOLD_MAX
            deadline = min(now + LINGER, latest)
            before = self._relayed.get(first.checkpoint_id, 0)  # acks of this checkpoint sent in earlier batches
            mine = before + 1
            while True:
                left = deadline - time.monotonic()
                try:
                    item = self._queue.get_nowait() if mine >= expected or left <= 0 else self._queue.get(timeout=left)
                except queue.Empty:
                    if mine >= expected or left <= 0:
                        break
                    continue
                if item is None:
                    self._queue.put(None)
                    break
                waiting.append(item)
                if item.checkpoint_id == first.checkpoint_id:
                    mine += 1
                    deadline = min(time.monotonic() + LINGER, latest)
            by_checkpoint: dict[int, list[_Pending]] = defaultdict(list)
            for p in waiting:
                by_checkpoint[p.checkpoint_id].append(p)
            for cp, items in sorted(by_checkpoint.items()):
                self._relayed[cp] = self._relayed.get(cp, 0) + len(items)
                self._batch(cp, items)
            for cp in [c for c in self._relayed if c < max(by_checkpoint) - 64]:
                del self._relayed[cp]

    def _batch(self, checkpoint_id: int, items: list[_Pending]) -> None:
        self.requests += 1
        self.acks += len(items)
        began = time.perf_counter()
        failed: dict | None = None
        try:
            result = self.client.ack_batch(self.job_id, checkpoint_id, [p.ack for p in items])
        except OvertakeError as e:
            status = 0 if isinstance(e, CoordinatorUnreachable) else (e.status_code or 0)
            failed = {"status": status, "code": e.code, "message": str(e)}
        except Exception as e:  # noqa: BLE001 - a transport error: the subtasks retry
            failed = {"status": 0, "code": "unreachable", "message": repr(e)}
        finally:
            self.request_seconds += time.perf_counter() - began
        if failed is not None:
            for p in items:
                p.conn.answer({"id": p.id, **failed})
            return
        for p, item in zip(items, result.items, strict=True):
            if item.ok:
                p.conn.answer({"id": p.id, "status": 200})
            else:
                p.conn.answer({"id": p.id, "status": item.status_code, "code": None, "message": item.error or ""})


class RelayUnusable(Exception):
    """The relay cannot be reached or did not answer: ack directly."""


class RelayClient:
    """A subtask's connection to its host's relay; ``ack`` returns when the relay answered this ack."""

    def __init__(self, address: tuple[str, int], token: str | None, wait: float = RELAY_WAIT) -> None:
        self.wait = wait
        self._lock = threading.Lock()  # one ack's exchange at a time
        self._send_lock = threading.Lock()  # one frame at a time (an ack's, or a metrics sample between them)
        self._next = 0
        try:
            self.sock = socket.create_connection(address, timeout=5.0)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _send_frame(self.sock, {"token": token or ""})
            hello = _recv_frame(self.sock)
        except (OSError, ConnectionError, ValueError) as e:
            raise RelayUnusable(f"the host's ack relay at {address[0]}:{address[1]} cannot be reached: {e}") from e
        if hello.get("status") != 200:
            self.sock.close()
            raise RelayUnusable(f"the host's ack relay refused this subtask: {hello.get('message')}")
        self.takes_metrics = bool(hello.get("metrics"))
        self.sock.settimeout(wait)

    def ack(self, checkpoint_id: int, ack: dict) -> dict:
        """The relay's answer for this ack (``status``, ``code``, ``message``). One ack at a time per subtask."""
        with self._lock:
            self._next += 1
            mine = self._next
            try:
                with self._send_lock:
                    _send_frame(self.sock, {"id": mine, "checkpoint_id": checkpoint_id, "ack": ack})
                while True:
                    answer = _recv_frame(self.sock)
                    if answer.get("id") == mine:
                        return answer
            except (OSError, ConnectionError, ValueError) as e:
                raise RelayUnusable(f"the host's ack relay did not answer: {e}") from e

    def metrics(self, report: dict[str, Any]) -> None:
        """Hand a metrics sample to the relay (no answer)."""
        try:
            with self._send_lock:
                _send_frame(self.sock, {"metrics": report})
        except (OSError, ConnectionError, ValueError) as e:
            raise RelayUnusable(f"the host's relay did not take a metrics sample: {e}") from e

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def raise_for(answer: dict, url: str) -> None:
    """Raise what the SDK would have raised for this ack's own request (nothing for a 200)."""
    status = int(answer.get("status") or 0)
    if status == 200:
        return
    message = str(answer.get("message") or "")
    if status == 0:
        raise CoordinatorUnreachable(f"the ack relay could not reach the coordinator: {message}", url)
    raise error_for_status(status, message, answer.get("code"))


class RelayReporter(SdkReporter):
    """:class:`SdkReporter` whose acks and live metrics go through the host's :class:`AckRelay` once
    :meth:`use_relay` named it. Everything else (acks with state through the coordinator, declines) goes directly,
    as before."""

    def __init__(self, client: Any, who: SubtaskIdentity, metrics_client: Any | None = None,
                 token: str | None = None) -> None:
        super().__init__(client, who, metrics_client)
        self.token = token
        self.relay: RelayClient | None = None
        self.relayed = 0
        self.metrics_relayed = 0

    def _report_metrics(self, metrics: dict[str, Any], timestamp: int) -> None:
        relay = self.relay
        if relay is None or not relay.takes_metrics:
            return super()._report_metrics(metrics, timestamp)
        w = self.who
        try:
            relay.metrics({"vertex": w.vertex, "subtask_index": w.subtask_index, "timestamp": timestamp,
                           "metrics": metrics})
        except RelayUnusable as e:
            log.warning("%s[%d] reports metrics directly from now on: %s", w.vertex, w.subtask_index, e)
            relay.takes_metrics = False
            return super()._report_metrics(metrics, timestamp)
        self.metrics_relayed += 1

    def use_relay(self, address: tuple[str, int] | None) -> None:
        if address is None:
            return
        try:
            self.relay = RelayClient(address, self.token)
        except RelayUnusable as e:
            log.warning("%s[%d] acks directly: %s", self.who.vertex, self.who.subtask_index, e)

    def ack(self, checkpoint_id: int, ack: dict[str, Any]) -> None:
        relay = self.relay
        if relay is None:
            return super().ack(checkpoint_id, ack)
        w = self.who
        body = SubtaskAck(attempt=w.attempt, vertex=w.vertex, subtask_index=w.subtask_index, **ack)
        try:
            answer = relay.ack(checkpoint_id, body.model_dump(mode="json"))
        except RelayUnusable as e:
            log.warning("%s[%d] acks directly from now on: %s", w.vertex, w.subtask_index, e)
            self.relay = None
            relay.close()
            return super().ack(checkpoint_id, ack)
        self.relayed += 1
        try:
            raise_for(answer, str(getattr(self.client, "base_url", "")))
        except Conflict as e:
            raise CheckpointDiscarded(str(e)) from e

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
            self.relay = None


def relay_of(peers: list[dict], me: int) -> dict | None:
    """The peer whose relay serves task ``me``: the lowest task on the same host that runs one, or None."""
    host = next((m["host"] for m in peers if m["task"] == me), None)
    mine = [m for m in peers if m["host"] == host and m.get("relay")]
    return min(mine, key=lambda m: m["task"]) if mine else None


__all__ = ["AckRelay", "RelayClient", "RelayReporter", "RelayUnusable", "raise_for", "relay_of"]
