"""``OvertakeListener``: a Structured Streaming query listener that reports existing PySpark streaming queries to
the Overtake coordinator (each query a job, each micro-batch a completed aligned checkpoint), and ``install``.

    spark.streams.addListener(OvertakeListener("http://127.0.0.1:8321"))

Spark calls the listener on its own threads; the listener only copies the event and queues it. A background
thread (``listener_reporter``) does the HTTP, so a slow or absent coordinator never slows or breaks a query.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

from client.sync import OvertakeClient
from spark_plugin.listener.progress import snapshot
from spark_plugin.listener.reporter import Outbox, Progress, Reporter, Started, Stats, Terminated

log = logging.getLogger("overtake.listener")

CONF_URL = "spark.overtake.coordinator"
CONF_TOKEN = "spark.overtake.token"
CONF_BUFFER = "spark.overtake.listener.bufferSize"


class OvertakeListener(StreamingQueryListener):
    """Reports every Structured Streaming query of the session to the coordinator at ``coordinator_url``.

    - A query is a job of kind ``structured_streaming``, labelled ``spark_query_id=<query id>``: a query
      restarted from its checkpoint location keeps its id, so it continues the same job with a new attempt.
      The job is registered at the first progress, whose sources, stateful operators and sink make its graph.
    - Each micro-batch is a completed aligned checkpoint whose id is the batch id.
    - A query that stops ends its job ``FINISHED``; one that fails ends it ``FAILED`` with the exception.

    At most ``buffer_size`` micro-batch reports wait while the coordinator is unreachable (retried with backoff
    from ``backoff`` up to ``max_backoff`` seconds); more are dropped, counted and logged. At interpreter exit
    the reports still queued get ``drain_on_exit`` seconds to go out.
    """

    def __init__(
        self,
        coordinator_url: str | None = None,
        token: str | None = None,
        buffer_size: int = 1000,
        *,
        labels: dict[str, str] | None = None,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
        timeout: float = 10.0,
        drain_on_exit: float = 5.0,
    ) -> None:
        super().__init__()
        self._client = OvertakeClient(coordinator_url, token, timeout=timeout, retries=2, backoff=0.2)
        self._outbox = Outbox(buffer_size)
        self._reporter = Reporter(self._client, self._outbox, dict(labels or {}), backoff, max_backoff)
        self._last_progress: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._reporter.start()
        if drain_on_exit > 0:
            ref = weakref.ref(self)
            atexit.register(lambda: (lambda me: me and me.close(drain_on_exit))(ref()))

    @property
    def coordinator_url(self) -> str:
        return self._client.base_url

    # ------------------------------------------------------------------------------------------- Spark's calls

    def onQueryStarted(self, event: Any) -> None:
        self._put(Started(str(event.id), str(event.runId), event.name))

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        try:
            snap = snapshot(progress)
        except Exception:  # a Spark version with other fields must not break the query
            log.exception(
                "overtake listener: cannot read the progress of query %s", getattr(progress, "id", "?")
            )
            return
        with self._lock:
            self._last_progress[snap["runId"]] = snap
        self._put(Progress(snap["id"], snap["runId"], snap.get("name"), snap))

    def onQueryIdle(self, event: Any) -> None:
        pass  # an idle trigger ran no batch: nothing to checkpoint

    def onQueryTerminated(self, event: Any) -> None:
        run_id = str(event.runId)
        with self._lock:
            last = self._last_progress.pop(run_id, None)
        name = last.get("name") if last else None
        self._put(Terminated(str(event.id), run_id, name, event.exception, last))

    def _put(self, item: Any) -> None:
        if self._closed:
            return
        try:
            self._outbox.put(item)
        except Exception:
            log.exception("overtake listener: could not queue an event")

    # ------------------------------------------------------------------------------------------- ours

    def stats(self) -> Stats:
        """Micro-batches reported, recorded before, refused, dropped, still queued; the job of each query."""
        return self._reporter.snapshot_stats()

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until every queued event was handled (reported, or given up); False if ``timeout`` passed."""
        return self._outbox.wait_empty(timeout)

    def close(self, timeout: float | None = 5.0) -> None:
        """Send what is queued (for at most ``timeout`` seconds), then stop the reporting thread.

        Remove the listener from Spark first (``spark.streams.removeListener``) to report nothing more."""
        if self._closed:
            return
        self._closed = True
        if not self.flush(timeout):
            left = self._outbox.pending()
            log.warning(
                "overtake listener: closing with %d events not sent to %s", left, self.coordinator_url
            )
        self._reporter.stop_event.set()
        self._outbox.wake()
        self._reporter.join(timeout=2.0)
        self._client.close()


def install(spark: Any, url: str | None = None, token: str | None = None, **options: Any) -> OvertakeListener:
    """Add an ``OvertakeListener`` to ``spark``'s streaming queries and return it.

    The coordinator is ``url``, else the session conf ``spark.overtake.coordinator``, else ``$OVERTAKE_URL``;
    the token likewise from ``spark.overtake.token`` or ``$OVERTAKE_TOKEN``; ``buffer_size`` may come from
    ``spark.overtake.listener.bufferSize``. Other options are those of ``OvertakeListener``.
    """
    conf = spark.conf
    url = url or conf.get(CONF_URL, None) or os.environ.get("OVERTAKE_URL")
    token = token or conf.get(CONF_TOKEN, None)
    if "buffer_size" not in options and conf.get(CONF_BUFFER, None):
        options["buffer_size"] = int(conf.get(CONF_BUFFER))
    listener = OvertakeListener(url, token, **options)
    spark.streams.addListener(listener)
    log.info("overtake listener: reporting streaming queries to %s", listener.coordinator_url)
    return listener
