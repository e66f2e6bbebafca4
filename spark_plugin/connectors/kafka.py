"""Kafka sink (confluent-kafka): output to a topic, committed exactly once when its checkpoint completes.

Modes:

- ``exactly_once`` (default): a checkpoint's records become visible to ``read_committed`` consumers when that
  checkpoint completes, once, across failures and restores.
- ``at_least_once``: records are produced as they come (idempotent producer, ``acks=all``); a checkpoint's barrier
  waits until every record before it is acknowledged by the broker, so a restore never loses output, but may repeat
  what was written after the restored checkpoint.
- ``none``: records are produced as they come; nothing waits for the broker at checkpoints.

**Exactly once: one transaction per commit, with its marker inside.** Flink's Kafka sink writes a checkpoint's
records into an open transaction and, after a failure, resumes that transaction by producer id and epoch to commit
it (a reflection hack on the Java client). confluent-kafka cannot resume a transaction it did not begin, so this
sink does what :class:`~spark_plugin.connectors.postgres.PostgresSink` does: the records written between two
checkpoints are serialized and kept with the sink's snapshot (they are part of operator state), and when the
coordinator reports checkpoint *n* completed (``notify_checkpoint_complete``) one Kafka transaction produces the
records of every pending checkpoint up to *n* **and** commits a marker: the synthetic consumer group
``overtake-sink.<job>.<name>.<subtask>`` gets the "offset" *n* on partition 0 of the topic, through
``send_offsets_to_transaction``. Records and marker commit atomically. Before it commits, the sink reads the
group's committed offset (a ``read_committed`` offset fetch, which waits for a pending transactional commit): a
checkpoint at or below it was committed already, by this attempt or by one that failed after committing, and is
skipped. Checkpoint ids of a job never repeat and grow across attempts, so the marker only grows. After it commits,
the sink reads the marker back: a commit counts (in ``committed_checkpoints``) only once Kafka shows
it, a marker that lags is committed again alone (a broker such as Tansu can hold a transaction's offsets back after
its records' commit), and a marker that does not move fails the subtask, whose restart checks the marker again
before committing.

Transactions never overlap: one begins and ends inside ``notify_checkpoint_complete``, so concurrent checkpoints
(``max_concurrent`` > 1) need no pool of transactional ids. A checkpoint that completes commits the pending records
of every older one still pending (an aborted checkpoint's records ride with the next one that completes, as its
snapshot holds them too).

**Zombies.** Every subtask's producer has the ``transactional.id`` ``overtake-sink.<job>.<name>.<subtask>``. A new
attempt calls ``init_transactions()`` with it before it reads a marker: the broker bumps the producer epoch, aborts
the transaction an older attempt left open and rejects every later produce or commit of that older producer
(``PRODUCER_FENCED``); a commit the older attempt had already sent completes first. Restoring the state of another
old subtask (a rescale) fences that subtask's transactional id the same way before committing its pending records.

**Rewind.** Kafka cannot withdraw committed records. An attempt that starts from a checkpoint older than this
subtask's marker (a fallback past a corrupt checkpoint, a restore from an older checkpoint or savepoint by name)
would write the later checkpoints' output a second time: the sink refuses (``KafkaRewindRefused``, raised from
``rewind``, before anything is written) unless it was built with ``on_rewind="duplicate"``, which accepts the
repeat and logs it.

The cost: records wait in the sink's memory and in its snapshots until their checkpoint completes, and become
visible one checkpoint interval later (as with Flink's transactional sink, for ``read_committed`` readers).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from spark_plugin.connectors.base import Sink

log = logging.getLogger(__name__)

MODES = ("exactly_once", "at_least_once", "none")
REWIND = ("refuse", "duplicate")
NO_OFFSET = -1001  # librdkafka's OFFSET_INVALID: the group has no committed offset
MARKER_RECOMMIT_EVERY = 0.5  # s a commit marker may lag before it is committed again, alone (see _verify_marker)
ABORT_WHEN_OVER = 2.0  # s the abort of a commit stopped because its attempt is over may take at most (see _abort)

# (key, value, headers, timestamp ms) as produced
Serialized = tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None, int | None]


class KafkaSinkError(RuntimeError):
    """Kafka refused or did not answer; nothing of the failed operation was committed."""


class KafkaRewindRefused(KafkaSinkError):
    """Output of a later checkpoint is committed in Kafka, which cannot withdraw it; nothing was written."""


def serialize(value: Any) -> bytes | None:
    """The default serializer: bytes as they are, str as UTF-8, None as None (no key, or a tombstone), anything
    else as compact JSON."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _headers(value: Any) -> list[tuple[str, bytes]] | None:
    if value is None:
        return None
    items = value.items() if isinstance(value, Mapping) else value
    return [(str(k), serialize(v)) for k, v in items]


def _fenced(err: Any) -> bool:
    """Whether a Kafka error says a newer producer of the same transactional.id fenced this one: by its code, or, for
    an error librdkafka wraps (a failed AddPartitionsToTxn inside a commit), by the broker's words it carries."""
    from confluent_kafka import KafkaError

    codes = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
    if hasattr(err, "code") and err.code() in codes:
        return True
    text = (err.str() if hasattr(err, "str") else str(err)).lower()
    return "fenced" in text or "fences the current one" in text


class KafkaSink(Sink):
    """Writes records to Kafka ``topic``: ``key(record)`` and ``value(record)`` (default: no key, the record) go
    through ``key_serializer``/``value_serializer`` (default :func:`serialize`), with optional ``headers(record)``
    (a dict or (name, value) pairs) and ``timestamp(record)`` (milliseconds since the epoch).

    ``name`` identifies the sink's transactional ids and commit markers within a job (default: the topic); two
    exactly-once sinks of one job writing one topic need different names. ``config`` adds librdkafka settings
    (security, compression, partitioner...). ``timeout`` bounds every wait for the broker, in seconds.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        key: Callable[[Any], Any] | None = None,
        value: Callable[[Any], Any] | None = None,
        headers: Callable[[Any], Mapping[str, Any] | Sequence[tuple[str, Any]] | None] | None = None,
        timestamp: Callable[[Any], int | None] | None = None,
        key_serializer: Callable[[Any], bytes | None] = serialize,
        value_serializer: Callable[[Any], bytes | None] = serialize,
        mode: str = "exactly_once",
        name: str | None = None,
        config: Mapping[str, Any] | None = None,
        timeout: float = 30.0,
        on_rewind: str = "refuse",
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"KafkaSink mode {mode!r} is not one of {', '.join(MODES)}")
        if on_rewind not in REWIND:
            raise ValueError(f"KafkaSink on_rewind {on_rewind!r} is not one of {', '.join(REWIND)}")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.key = key
        self.value = value
        self.headers = headers
        self.timestamp = timestamp
        self.key_serializer = key_serializer
        self.value_serializer = value_serializer
        self.mode = mode
        self.name = name or topic
        self.config = dict(config or {})
        self.timeout = timeout
        self.on_rewind = on_rewind
        self.commits_on_checkpoints = mode == "exactly_once"
        self.buffer: list[Serialized] = []
        self.pending: list[tuple[int, list[Serialized]]] = []
        self.committed_records = 0
        self.committed_checkpoints: list[int] = []
        self.skipped_checkpoints: list[int] = []  # found committed already (by an attempt that failed after it)
        self.marker_reads_back: list[float] = []  # s from a commit's return to its marker read back
        self.marker_recommits: list[tuple[int, int]] = []  # (checkpoint, times) its marker was committed again
        self.produced_records = 0
        self.restarts_from: int | None = None  # the checkpoint this attempt starts from (set by rewind)
        self._producer = None
        self._markers: dict[int, Any] = {}  # subtask -> the consumer of its marker group
        self._failures: list[Any] = []
        self._over: str | None = None  # why this subtask's attempt is over (set by attempt_over: a zombie)
        self._writing: Any = None  # the producer of the commit in progress

    # -- set-up ---------------------------------------------------------------------------------------------------

    def _conf(self, **extra: Any) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap_servers, **self.config, **extra}

    def _where(self) -> str:
        subtask = getattr(self, "subtask_index", "-")  # set by open
        return f"KafkaSink {self.name!r} (topic {self.topic!r}, job {self.job_id}, subtask {subtask})"

    def _error(self, what: str, e: BaseException) -> KafkaSinkError:
        err = e.args[0] if e.args else e
        text = err.str() if hasattr(err, "str") else str(err)
        if _fenced(err):
            text += (" (this producer is fenced: a newer attempt opened a producer with the same transactional.id, "
                     "so this attempt writes nothing more)")
        return KafkaSinkError(f"{self._where()}: {what} failed: {text}")

    def open(self, subtask_index: int, parallelism: int) -> None:
        from confluent_kafka import KafkaException, Producer

        super().open(subtask_index, parallelism)
        conf = self._conf(**{"socket.connection.setup.timeout.ms": int(self.timeout * 1000)})
        if self.mode == "exactly_once":
            probe = Producer(conf)
        else:
            conf.setdefault("enable.idempotence", self.mode == "at_least_once")
            conf.setdefault("acks", "all" if self.mode == "at_least_once" else "1")
            probe = self._producer = Producer(conf)
        try:
            topics = probe.list_topics(timeout=self.timeout).topics  # all topics: does not create one
        except KafkaException as e:
            raise KafkaSinkError(
                f"{self._where()}: Kafka at {self.bootstrap_servers} did not answer within {self.timeout} s "
                f"({e.args[0].str() if e.args else e}); check bootstrap_servers and that the brokers run"
            ) from e
        meta = topics.get(self.topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise KafkaSinkError(
                f"{self._where()}: topic {self.topic!r} does not exist on Kafka at {self.bootstrap_servers}"
                f"{f' ({meta.error.str()})' if meta is not None and meta.error is not None else ''}; "
                "create it first (the sink does not create topics)"
            )

    def _transactional(self, subtask: int):
        """A transactional producer for ``subtask``'s id, initialized: every older producer with that id is
        fenced, and a transaction it left open is aborted (or completed, when its commit was already sent)."""
        from confluent_kafka import KafkaException, Producer

        txid = f"overtake-sink.{self.job_id}.{self.name}.{subtask}"
        producer = Producer(self._conf(**{"transactional.id": txid, "enable.idempotence": True}))
        try:
            producer.init_transactions(self.timeout)
        except KafkaException as e:
            raise self._error(f"init_transactions({txid!r})", e) from e
        return producer

    def _marker_consumer(self, subtask: int):
        from confluent_kafka import Consumer

        consumer = self._markers.get(subtask)
        if consumer is None:
            consumer = self._markers[subtask] = Consumer(
                self._conf(**{
                    "group.id": f"overtake-sink.{self.job_id}.{self.name}.{subtask}",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",  # the offset fetch waits for pending transactional commits
                })
            )
        return consumer

    def _marker(self, subtask: int) -> int | None:
        """The last checkpoint committed for ``subtask`` (None: none)."""
        from confluent_kafka import KafkaException, TopicPartition

        try:
            (tp,) = self._marker_consumer(subtask).committed([TopicPartition(self.topic, 0)], timeout=self.timeout)
        except KafkaException as e:
            raise self._error("reading the commit marker", e) from e
        if tp.error is not None:
            raise KafkaSinkError(f"{self._where()}: reading the commit marker failed: {tp.error.str()}")
        return None if tp.offset < 0 else tp.offset

    def _verify_marker(self, producer: Any, subtask: int, last: int, group: Any) -> None:
        """Read ``subtask``'s marker back after a commit: a commit counts only once Kafka shows it.

        ``commit_transaction`` returning is the client's word; the marker read with ``read_committed`` is the
        broker's. Kafka writes a committed transaction's offsets when it writes its commit markers, and a
        ``read_committed`` offset fetch waits for them, so the first read shows ``last``. Some Kafka-protocol brokers
        apply them later: Tansu writes a transaction's records' commit markers at once but applies its offsets only
        when no transaction overlapping it on a partition is still open, and does not come back to them when the
        last such one ends after a third: the offsets wait for the next transaction on that partition to end. While
        the marker lags, this re-commits it, every ``MARKER_RECOMMIT_EVERY`` s, in a transaction of the marker alone
        (the same offset from the same producer: on Kafka, a rewrite of what is there), which makes such a broker
        apply it.

        If it still does not read ``last`` (or later: a newer attempt may have moved it) within ``timeout``, the
        transaction's outcome is unknown to this sink, so it fails rather than report the records committed: the
        restart reads the marker again before it commits."""
        start = time.monotonic()
        deadline = start + self.timeout
        recommit_at = start + MARKER_RECOMMIT_EVERY
        pause = 0.005
        marker = self._marker(subtask)
        while (marker is None or marker < last) and time.monotonic() < deadline:
            self._check_over()
            if time.monotonic() >= recommit_at:
                self._recommit_marker(producer, subtask, last, group)
                recommit_at = time.monotonic() + MARKER_RECOMMIT_EVERY
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
            marker = self._marker(subtask)
        self.marker_reads_back.append(time.monotonic() - start)
        if marker is None or marker < last:
            recommits = sum(n for c, n in self.marker_recommits if c == last)
            raise KafkaSinkError(
                f"{self._where()}: the transaction for checkpoint {last} (subtask {subtask}) reported committed, but "
                f"its commit marker still reads {'nothing' if marker is None else marker} {self.timeout:g} s later"
                f"{f' and {recommits} re-commits of it alone' if recommits else ''}: "
                "the commit is not visible in Kafka, so its outcome is unknown; failing so that a restart checks the "
                "marker before committing"
            )

    def _recommit_marker(self, producer: Any, subtask: int, last: int, group: Any) -> None:
        """Commit ``subtask``'s marker ``last`` again, alone in a transaction (see :meth:`_verify_marker`)."""
        from confluent_kafka import KafkaException, TopicPartition

        try:
            producer.begin_transaction()
            mark = TopicPartition(self.topic, 0, last, f"overtake checkpoint {last}")
            producer.send_offsets_to_transaction([mark], group, self.timeout)
            producer.commit_transaction(self.timeout)
        except KafkaException as e:
            self._abort(producer, e)
            raise self._error(f"re-committing the marker of checkpoint {last} (subtask {subtask})", e) from e
        if self.marker_recommits and self.marker_recommits[-1][0] == last:
            self.marker_recommits[-1] = (last, self.marker_recommits[-1][1] + 1)
        else:
            self.marker_recommits.append((last, 1))
        log.info(
            "%s: the commit marker of checkpoint %d (subtask %d) did not read back within %g s: committed it again, "
            "alone", self._where(), last, subtask, MARKER_RECOMMIT_EVERY,
        )

    # -- the Sink contract ----------------------------------------------------------------------------------------

    def rewind(self, job_id: int, checkpoint_id: int | None) -> None:
        super().rewind(job_id, checkpoint_id)
        self.restarts_from = checkpoint_id
        if self.mode != "exactly_once":
            return
        self._producer = self._transactional(self.subtask_index)  # fences this subtask's older attempts first
        self._check_rewind(self.subtask_index)

    def _check_rewind(self, subtask: int) -> None:
        """Refuse (or, with ``on_rewind="duplicate"``, log) a start from before ``subtask``'s committed output."""
        marker = self._marker(subtask)
        start = self.restarts_from
        if marker is None or (start is not None and marker <= start):
            return
        where = "the start of its input" if start is None else f"checkpoint {start}"
        if self.on_rewind == "refuse":
            raise KafkaRewindRefused(
                f"{self._where()}: the output of checkpoint {marker} (of subtask {subtask}) is committed in Kafka and "
                f"this attempt starts from {where}: Kafka cannot withdraw committed records, so the output after "
                f"{where} would be written twice. Restore from checkpoint {marker} or later, or build the sink with "
                "on_rewind='duplicate' to accept the repeat"
            )
        log.warning(
            "%s: restarts from %s, and the output of subtask %d up to checkpoint %d is committed already: it is "
            "written again (on_rewind='duplicate')", self._where(), where, subtask, marker,
        )

    def _serialize(self, record: Any) -> Serialized:
        try:
            key = self.key_serializer(self.key(record)) if self.key is not None else None
            value = self.value_serializer(self.value(record) if self.value is not None else record)
            headers = _headers(self.headers(record)) if self.headers is not None else None
            ts = self.timestamp(record) if self.timestamp is not None else None
            if key is not None and not isinstance(key, bytes):
                raise TypeError(f"the key serializer returned {type(key).__name__}, not bytes")
            if value is not None and not isinstance(value, bytes):
                raise TypeError(f"the value serializer returned {type(value).__name__}, not bytes")
            if ts is not None and not isinstance(ts, int):
                raise TypeError(f"the timestamp is {type(ts).__name__} {ts!r}, not int milliseconds")
        except Exception as e:
            raise KafkaSinkError(f"{self._where()}: cannot serialize record {record!r:.200}: {e}") from e
        return key, value, headers, ts

    def write(self, record: Any) -> None:
        item = self._serialize(record)
        if self.mode == "exactly_once":
            self.buffer.append(item)
        else:
            self._check_deliveries()
            self._produce(self._producer, item)
            self.produced_records += 1

    def snapshot(self, checkpoint_id: int) -> Any:
        if self.mode != "exactly_once":
            if self.mode == "at_least_once":
                self._flush(self._producer, f"flushing for checkpoint {checkpoint_id}")
            return None
        if self.buffer:
            self.pending.append((checkpoint_id, self.buffer))
            self.buffer = []
        return {"subtask": self.subtask_index, "pending": list(self.pending)}

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if self.mode != "exactly_once":
            return
        due = [(c, items) for c, items in self.pending if c <= checkpoint_id]
        if due:
            self._commit(self._producer, self.subtask_index, due)
            self.pending = [(c, items) for c, items in self.pending if c > checkpoint_id]

    def restore(self, state: Any) -> None:
        if self.mode != "exactly_once" or not state:
            return
        subtask = state.get("subtask", self.subtask_index)
        due = [(c, list(items)) for c, items in state["pending"]]  # all of a completed checkpoint
        if subtask == self.subtask_index:
            if due:
                self._commit(self._producer, subtask, due)
        else:
            # Another old subtask's state (a rescale): old subtask s goes to new subtask s % parallelism, so s is
            # not an index of this attempt and no subtask of it uses s's transactional id: fence s's older attempts
            # with it, check s's marker as rewind checks this subtask's, then commit as s.
            producer = self._transactional(subtask)
            try:
                self._check_rewind(subtask)
                if due:
                    self._commit(producer, subtask, due)
            finally:
                producer.flush(self.timeout)
        self.pending = []

    def attempt_over(self, reason: str) -> None:
        """A newer attempt started (or the job ended) while this subtask may still be committing: stop producing
        and drop what the producer still holds, so that nothing of it reaches Kafka after the next attempt's
        ``init_transactions`` fenced this producer. Kafka refuses such records. Tansu fences them too, but a produce
        it is still handling while that ``init_transactions`` rolls the open transaction back is attached to the
        rolled-back transaction, and from then on Tansu applies no later transaction's offsets on that partition
        (no commit marker reads back there again): a zombie that stops when told, about a second before the next
        attempt's tasks start, has nothing in progress then."""
        self._over = reason
        producer = self._writing
        if producer is not None:
            try:
                producer.purge(in_queue=True, in_flight=True, blocking=False)
            except Exception as e:  # noqa: BLE001 - the commit still stops at its next record
                log.warning("%s: dropping the producer's queued records failed: %s", self._where(), e)

    def _check_over(self) -> None:
        if self._over is not None:
            raise KafkaSinkError(f"{self._where()}: stopped committing, the attempt is over: {self._over}")

    def uncommitted(self) -> bool:
        return bool(self.buffer or self.pending)

    def release(self) -> None:
        """Drop the producer without flushing or committing (its open transaction is aborted by the next attempt's
        ``init_transactions``) and close the marker consumers: a failed subtask leaves no client behind."""
        self._producer = None
        self._close_markers()

    def _close_markers(self) -> None:
        markers, self._markers = list(self._markers.values()), {}
        for consumer in markers:
            consumer.close()

    def close(self) -> Any:
        producer, self._producer = self._producer, None
        try:
            if producer is not None and self.mode != "exactly_once":
                self._flush(producer, "flushing at close")
        finally:
            self._close_markers()
        return {
            "committed_records": self.committed_records,
            "committed_checkpoints": self.committed_checkpoints,
            "skipped_checkpoints": self.skipped_checkpoints,
            "uncommitted_records": len(self.buffer) + sum(len(items) for _, items in self.pending),
            "produced_records": self.produced_records,
            "marker_recommits": self.marker_recommits,
        }

    # -- producing ------------------------------------------------------------------------------------------------

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._failures.append(err)

    def _check_deliveries(self) -> None:
        if self._failures:
            err = self._failures[0]
            self._failures = []
            raise KafkaSinkError(f"{self._where()}: Kafka refused a record: {err.str()}")

    def _produce(self, producer: Any, item: Serialized) -> None:
        from confluent_kafka import KafkaException

        key, value, headers, ts = item
        kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": self._delivered}
        if headers:
            kwargs["headers"] = headers
        if ts is not None:
            kwargs["timestamp"] = ts
        deadline = time.monotonic() + self.timeout
        while True:
            if self._over is not None:
                self._check_over()
            try:
                producer.produce(self.topic, **kwargs)
                break
            except BufferError as e:  # the local queue is full: serve deliveries until there is room
                if time.monotonic() > deadline:
                    raise KafkaSinkError(
                        f"{self._where()}: the producer's queue stayed full for {self.timeout} s: Kafka at "
                        f"{self.bootstrap_servers} takes no records"
                    ) from e
                producer.poll(0.1)
            except KafkaException as e:
                raise self._error("producing a record", e) from e
        producer.poll(0)

    def _flush(self, producer: Any, what: str) -> None:
        left = producer.flush(self.timeout)
        self._check_deliveries()
        if left:
            raise KafkaSinkError(
                f"{self._where()}: {what}: {left} records not acknowledged by Kafka at {self.bootstrap_servers} "
                f"within {self.timeout} s"
            )

    def _abort(self, producer: Any, cause: BaseException) -> None:
        """Abort the transaction of a failed commit, when the producer still can. A fenced producer or one in a
        fatal state cannot: its abort would only wait out ``timeout`` (the zombie of a restart then stayed up that
        long before it failed), and the broker aborts the transaction anyway, at the latest when the newer attempt
        initializes the transactional id (for a fenced one, it did already).

        A commit stopped because its attempt is over (``attempt_over``) is aborted within ``ABORT_WHEN_OVER`` at most:
        when a newer attempt started, its ``init_transactions`` has fenced this producer or is about to abort the
        transaction, and the abort could only wait out ``timeout``; when the job ended, a broker that answers aborts
        in milliseconds, so that ``read_committed`` readers do not wait for the transaction's own timeout."""
        from confluent_kafka import KafkaException

        err = cause.args[0] if isinstance(cause, KafkaException) and cause.args else None
        if err is not None and (_fenced(err) or (hasattr(err, "fatal") and err.fatal())):
            log.info("%s: the failed commit's transaction is not aborted here: %s", self._where(), err)
            return
        try:
            producer.abort_transaction(self.timeout if self._over is None else min(self.timeout, ABORT_WHEN_OVER))
        except KafkaException as e:
            log.warning("%s: aborting the failed commit's transaction failed too: %s", self._where(), e)

    def _commit(self, producer: Any, subtask: int, due: list[tuple[int, list[Serialized]]]) -> None:
        """Produce the records of checkpoints ``due`` not committed yet and move ``subtask``'s marker to the last
        of them, in one transaction."""
        from confluent_kafka import KafkaException, TopicPartition

        marker = self._marker(subtask)
        todo = [(c, items) for c, items in due if marker is None or c > marker]
        skipped = [c for c, _ in due if marker is not None and c <= marker]
        if skipped:
            # the only path on which output held by this sink is dropped: say why, with the marker it trusted
            log.warning(
                "%s: checkpoint(s) %s of subtask %d skipped (%d records): its commit marker reads %s, so they were "
                "committed already", self._where(), skipped, subtask,
                sum(len(items) for c, items in due if c in skipped), marker,
            )
        self.skipped_checkpoints.extend(skipped)
        if not todo:
            return
        last = max(c for c, _ in todo)
        group = self._marker_consumer(subtask).consumer_group_metadata()
        self._failures = []
        self._check_over()
        self._writing = producer
        try:
            producer.begin_transaction()
            for _, items in todo:
                for item in items:
                    self._produce(producer, item)
            mark = TopicPartition(self.topic, 0, last, f"overtake checkpoint {last}")
            producer.send_offsets_to_transaction([mark], group, self.timeout)
            producer.commit_transaction(self.timeout)
        except (KafkaException, KafkaSinkError) as e:
            # a commit whose records failed delivery says only "n message(s) failed delivery": name the first
            # record's own reason (e.g. the producer was fenced) too
            first = self._failures[0] if self._failures else None
            self._failures = []
            self._abort(producer, e)
            if isinstance(e, KafkaSinkError):
                raise
            self._check_over()  # the purge of attempt_over failed it: say so, not "purged"
            error = self._error(f"committing checkpoints {[c for c, _ in todo]}", e)
            if first is not None:
                reason = first.str() if hasattr(first, "str") else str(first)
                error = KafkaSinkError(f"{error} (first record's delivery: {reason})")
            raise error from e
        finally:
            self._writing = None
        self._check_over()  # a commit that completed as the attempt ended: not counted, the restart checks it
        self._check_deliveries()
        self._verify_marker(producer, subtask, last, group)
        self.committed_records += sum(len(items) for _, items in todo)
        self.committed_checkpoints.extend(c for c, _ in todo)
