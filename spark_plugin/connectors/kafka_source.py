"""Kafka source (confluent-kafka): a partitioned source whose splits are topic partitions and whose positions are
offsets, read with ``assign()`` (never a consumer group's rebalancing) by one consumer per source subtask.

**Splits and positions.** Split ``"<topic>-<partition>"`` (``orders-3``) is one partition; the runtime assigns
splits round robin by partition number, keeps each split's position (the offset of the next record to read) in every
checkpoint, and moves whole partitions on a rescale. A restore reads each partition from the checkpoint's offset:
nothing kept in Kafka counts for correctness.

**Where a split starts** when the checkpoint has no offset for it:

- a partition listed at a fresh start: ``start`` — ``"earliest"``, ``"latest"``, a timestamp (epoch ms: the first
  record at or after it, then everything after that record), or ``"committed"`` (the offsets ``group_id`` committed;
  a partition without one starts at ``committed_fallback``);
- a partition that appeared later (added to the topic while running, or since the restored checkpoint): its
  beginning, since every record of it was written after the job started.

**Reading never blocks the subtask's loop.** ``consume(num, timeout=0)`` takes what the consumer fetched; records go
to per-split buffers so each split reader returns only its partition's records. A split whose buffer is full is paused
in the consumer (no fetching for it) and resumed when it is empty again. A split the runtime pauses (backpressure)
is not: the consumer keeps fetching ahead for it, up to that buffer, so its records are at hand when the runtime
takes records again (``kafka_partition``). A reader's position is the offset after the last record it returned to the runtime, never after the
last one fetched.

**Offsets committed back** (``commit_offsets_on_checkpoint=True`` with ``group_id``): when a checkpoint completes,
its offsets are committed to ``group_id`` asynchronously, so the usual Kafka tools show the job's progress and lag.
Monitoring only: a restore reads the checkpoint's offsets, and the group is read only by ``start="committed"``.

**Batches** (``batches=True``): each poll of a split gives one ``pyarrow.RecordBatch`` of up to ``batch_rows`` of
its partition's records (``kafka_records.record_batch`` says its columns); the position is the offset after the
batch's last record, so checkpoints, restores and rescales are those of the record form.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from spark_plugin.connectors.base import PartitionedSource, SplitReader
from spark_plugin.connectors.kafka_partition import BUFFERED, PartitionReader
from spark_plugin.connectors.kafka_records import (
    DESERIALIZERS,
    KAFKA_COLUMNS,
    KafkaRecord,
    arrow_type,
    deserializer,
    parse_split,
    record_batch,
    split_id,
)

log = logging.getLogger(__name__)

STARTS = ("earliest", "latest", "committed")
__all__ = ["BUFFERED", "DESERIALIZERS", "KAFKA_COLUMNS", "KafkaRecord", "KafkaSource", "KafkaSourceError", "parse_split", "split_id"]


class KafkaSourceError(RuntimeError):
    """Kafka did not answer, or refused: the message names the source's brokers and topic."""


class KafkaSource(PartitionedSource):
    """Reads ``topics`` (a name or several) from Kafka at ``bootstrap_servers``.

    Records are :class:`KafkaRecord` with key and value through ``key_deserializer``/``value_deserializer``
    (``"bytes"``, ``"str"``, ``"json"`` or a function of the bytes), or whatever ``to_record(record)`` makes of that
    record. ``start`` is where partitions start that the checkpoint has no offset for (see the module). With
    ``stop_at="end"`` the source is bounded: each partition ends at its end offset when its reader opens.

    ``group_id`` names the group whose offsets ``start="committed"`` reads and ``commit_offsets_on_checkpoint``
    writes; no group is ever joined. ``discovery_interval`` (s; None: never; default 30, or never with
    ``stop_at="end"``) lists the partitions again while running. ``isolation_level`` is ``read_committed`` by default; ``config`` adds librdkafka consumer settings;
    ``timeout`` (s) bounds every wait for the broker (metadata, offsets).

    With ``batches=True`` each record is a ``pyarrow.RecordBatch`` of up to ``batch_rows`` records of one partition
    (a batch stream): a ``value`` column, or with ``value_columns=True`` the top-level fields of JSON-object values
    as columns (typed by ``value_schema``, a ``pyarrow.Schema``, or inferred per batch), then ``key``, ``topic``,
    ``partition``, ``offset``, ``timestamp`` (epoch ms) and, with ``include_headers=True``, ``headers``.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topics: str | Sequence[str],
        *,
        start: str | int = "earliest",
        committed_fallback: str = "earliest",
        group_id: str | None = None,
        commit_offsets_on_checkpoint: bool = False,
        key_deserializer: str | Callable[[bytes | None], Any] = "bytes",
        value_deserializer: str | Callable[[bytes | None], Any] = "bytes",
        to_record: Callable[[KafkaRecord], Any] | None = None,
        stop_at: str | None = None,
        discovery_interval: float | None | str = "default",
        isolation_level: str = "read_committed",
        config: Mapping[str, Any] | None = None,
        timeout: float = 30.0,
        batch: int = 500,
        batches: bool = False,
        batch_rows: int = 1024,
        value_columns: bool = False,
        value_schema: Any = None,
        include_headers: bool = False,
    ) -> None:
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        if not self.topics or not all(isinstance(t, str) and t for t in self.topics):
            raise ValueError(f"KafkaSource needs one or more topic names, got {topics!r}")
        if not (start in STARTS or (isinstance(start, int) and not isinstance(start, bool) and start >= 0)):
            raise ValueError(
                f"KafkaSource start {start!r} is not one of {', '.join(STARTS)} or a timestamp in epoch ms (an int >= 0)"
            )
        if committed_fallback not in ("earliest", "latest"):
            raise ValueError(f"KafkaSource committed_fallback {committed_fallback!r} is not 'earliest' or 'latest'")
        if (start == "committed" or commit_offsets_on_checkpoint) and not group_id:
            raise ValueError("KafkaSource: start='committed' and commit_offsets_on_checkpoint need a group_id")
        if stop_at not in (None, "end"):
            raise ValueError(f"KafkaSource stop_at {stop_at!r} is not None (unbounded) or 'end'")
        if isolation_level not in ("read_committed", "read_uncommitted"):
            raise ValueError(f"KafkaSource isolation_level {isolation_level!r} is not read_committed or read_uncommitted")
        if discovery_interval == "default":  # a bounded source ends once its partitions did: it lists them once
            discovery_interval = None if stop_at == "end" else 30.0
        if discovery_interval is not None and not discovery_interval > 0:
            raise ValueError(f"KafkaSource discovery_interval {discovery_interval!r} must be positive seconds or None")
        if batches and to_record is not None:
            raise ValueError("KafkaSource: to_record makes records, batches=True makes batches; choose one "
                             "(map_batches changes batches)")
        if not batches and (value_columns or value_schema is not None or include_headers):
            raise ValueError("KafkaSource: value_columns, value_schema and include_headers shape batches: they need "
                             "batches=True")
        if value_schema is not None and not value_columns:
            raise ValueError("KafkaSource: value_schema types the value's fields as columns: it needs "
                             "value_columns=True")
        if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
            raise ValueError(f"KafkaSource batch_rows {batch_rows!r} must be a positive int")
        self.bootstrap_servers = bootstrap_servers
        self.start = start
        self.committed_fallback = committed_fallback
        self.group_id = group_id
        self.commit_offsets_on_checkpoint = commit_offsets_on_checkpoint
        self.key_deserializer = deserializer(key_deserializer, "key_deserializer")
        self.value_deserializer = deserializer(value_deserializer, "value_deserializer")
        self.to_record = to_record
        self.stop_at = stop_at
        self.discovery_interval = discovery_interval
        self.isolation_level = isolation_level
        self.config = dict(config or {})
        self.timeout = timeout
        self.batch = batch
        self.batches = batches
        self.batch_rows = batch_rows
        self._batch_shape = {
            "key_type": arrow_type(key_deserializer), "value_type": arrow_type(value_deserializer),
            "value_columns": value_columns, "value_schema": value_schema, "include_headers": include_headers,
        }
        self.committed_checkpoints: list[int] = []
        self._consumer: Any = None
        self._readers: dict[tuple[str, int], PartitionReader] = {}
        self._initial: set[str] | None = None  # the partitions of a fresh start's first listing
        self._listed: list[str] | None = None  # the last listing that succeeded
        self._starts: dict[str, Any] = {}  # where this subtask's partitions of a fresh start begin (positions)
        self._taking: int | None = None
        self._checkpoint_positions: dict[int, dict[str, int]] = {}

    # -- set-up ---------------------------------------------------------------------------------------------------

    def _where(self) -> str:
        subtask = getattr(self, "subtask_index", "-")
        return f"KafkaSource (topics {', '.join(map(repr, self.topics))}, Kafka at {self.bootstrap_servers}, subtask {subtask})"

    def _error(self, what: str, e: BaseException) -> KafkaSourceError:
        err = e.args[0] if e.args else e
        text = err.str() if hasattr(err, "str") else str(err)
        return KafkaSourceError(f"{self._where()}: {what} failed: {text}")

    def open(self, subtask_index: int, parallelism: int) -> None:
        from confluent_kafka import Consumer

        self.subtask_index = subtask_index
        self._consumer = Consumer({
            "bootstrap.servers": self.bootstrap_servers,
            # no group is joined (partitions are assigned); the id names the group of committed offsets only
            "group.id": self.group_id or "overtake-source",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,  # the end of a partition moves its position past control records
            "isolation.level": self.isolation_level,
            "socket.connection.setup.timeout.ms": int(self.timeout * 1000),
            **self.config,
        })
        try:
            super().open(subtask_index, parallelism)
        except BaseException:
            self.release()  # a source that cannot start (no such topic, no broker) leaves no consumer behind
            raise

    def list_splits(self) -> list[str]:
        try:
            splits = self.topic_splits()
        except KafkaSourceError as e:
            if self._listed is None:
                raise  # at the start: the source cannot read anything
            # discovery while running: the partitions known so far are read on; the next listing tries again
            log.warning("%s: listing the partitions again failed, reading the known ones on: %s", self._where(), e)
            return self._listed
        self._listed = splits
        if self._initial is None and not self.restored_splits:
            self._initial = set(splits)
            # resolve where this subtask's partitions start now, once: a checkpoint taken before a partition's
            # reader opened holds that offset, so a restore does not resolve "latest" (or a timestamp) again
            from spark_plugin.connectors.split_reading import split_owner

            for split in splits:
                if split_owner(split, self.parallelism) == self.subtask_index:
                    offset, skip_before = self._start_offset(*parse_split(split))
                    self._starts[split] = offset if skip_before is None else {"offset": offset, "skip_before": skip_before}
        return splits

    def topic_splits(self) -> list[str]:
        """Every partition of the topics, from the broker's metadata, as split ids."""
        from confluent_kafka import KafkaException

        try:
            meta = self._consumer.list_topics(timeout=self.timeout).topics  # all topics: never creates one
        except KafkaException as e:
            raise KafkaSourceError(
                f"{self._where()}: Kafka did not answer within {self.timeout} s "
                f"({e.args[0].str() if e.args else e}); check bootstrap_servers and that the brokers run"
            ) from e
        splits = []
        for topic in self.topics:
            t = meta.get(topic)
            if t is None or t.error is not None or not t.partitions:
                raise KafkaSourceError(
                    f"{self._where()}: topic {topic!r} does not exist"
                    f"{f' ({t.error.str()})' if t is not None and t.error is not None else ''}; create it first "
                    "(the source does not create topics)"
                )
            splits += [split_id(topic, p) for p in sorted(t.partitions)]
        return splits

    def _is_new(self, split: str) -> bool:
        """Whether ``split`` appeared after the job started (after its first listing, or after the restored
        checkpoint): it is read from its beginning, whatever ``start`` says."""
        known = set(self.restored_splits) if self.restored_splits else (self._initial or set())
        return split not in known

    def build_split_reader(self, split: str, position: Any | None) -> SplitReader:
        topic, partition = parse_split(split)
        skip_before = None
        if position is None and not self._is_new(split):
            position = self._starts.get(split)
        if isinstance(position, dict):  # started from a timestamp, no record at or after it seen yet
            offset, skip_before = int(position["offset"]), int(position["skip_before"])
        elif position is not None:
            offset = int(position)
        elif self._is_new(split):
            offset = self._watermarks(topic, partition)[0]
        else:
            offset, skip_before = self._start_offset(topic, partition)
        end = self._watermarks(topic, partition)[1] if self.stop_at == "end" else None
        reader = PartitionReader(self, split, topic, partition, offset, end, skip_before)
        self._readers[(topic, partition)] = reader
        self._assign(reader)
        return reader

    # -- offsets from the broker ----------------------------------------------------------------------------------

    def _watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            return self._consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=self.timeout)
        except KafkaException as e:
            raise self._error(f"reading the offsets of {split_id(topic, partition)}", e) from e

    def _start_offset(self, topic: str, partition: int) -> tuple[int, int | None]:
        """The first offset of a partition listed at a fresh start, per ``start``; and the timestamp before which
        records are skipped (a ``start`` timestamp)."""
        from confluent_kafka import KafkaException, TopicPartition

        low, high = self._watermarks(topic, partition)
        if self.start == "earliest":
            return low, None
        if self.start == "latest":
            return high, None
        try:
            if self.start == "committed":
                (tp,) = self._consumer.committed([TopicPartition(topic, partition)], timeout=self.timeout)
                if tp.error is None and tp.offset >= 0:
                    return max(tp.offset, low), None
                if tp.error is not None:
                    raise KafkaSourceError(f"{self._where()}: reading the committed offset failed: {tp.error.str()}")
                return (low if self.committed_fallback == "earliest" else high), None
            (tp,) = self._consumer.offsets_for_times([TopicPartition(topic, partition, self.start)], timeout=self.timeout)
        except KafkaException as e:
            raise self._error(f"looking up the start offset of {split_id(topic, partition)}", e) from e
        # the broker's first offset at or after the timestamp (-1: none yet, start at the end); records before the
        # first one at or after the timestamp are skipped too, in case the broker's time index answers earlier
        offset = high if tp.error is not None or tp.offset < 0 else max(tp.offset, low)
        return offset, int(self.start)

    # -- the consumer ---------------------------------------------------------------------------------------------

    def _assign(self, reader: PartitionReader) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            self._consumer.incremental_assign([TopicPartition(reader.topic, reader.partition, reader.fetched)])
        except KafkaException as e:
            raise self._error(f"assigning {reader.split}", e) from e

    def _unassign(self, reader: PartitionReader) -> None:
        from confluent_kafka import TopicPartition

        if self._readers.get((reader.topic, reader.partition)) is reader:
            del self._readers[(reader.topic, reader.partition)]
            if self._consumer is not None:
                self._consumer.incremental_unassign([TopicPartition(reader.topic, reader.partition)])

    def _set_paused(self, reader: PartitionReader, paused: bool) -> None:
        from confluent_kafka import TopicPartition

        tp = [TopicPartition(reader.topic, reader.partition)]
        if paused:
            self._consumer.pause(tp)
        else:
            self._consumer.resume(tp)

    def _fetch(self) -> None:
        """Route what the consumer fetched to the buffers of its partitions' readers (never waits)."""
        from confluent_kafka import KafkaError

        for msg in self._consumer.consume(self.batch, timeout=0):
            reader = self._readers.get((msg.topic(), msg.partition()))
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if reader is not None:
                        reader.at_end(msg.offset())
                    continue
                if err.fatal() or err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION,
                                                 KafkaError.TOPIC_AUTHORIZATION_FAILED):
                    raise KafkaSourceError(f"{self._where()}: reading {msg.topic()}-{msg.partition()}: {err.str()}")
                log.warning("%s: %s", self._where(), err.str())
                continue
            if reader is not None:
                reader.fetched_record(msg)

    def record(self, msg: Any) -> Any:
        """The pipeline's record for a consumed message."""
        ts_type, ts = msg.timestamp()
        try:
            rec = KafkaRecord(
                topic=msg.topic(), partition=msg.partition(), offset=msg.offset(),
                key=self.key_deserializer(msg.key()), value=self.value_deserializer(msg.value()),
                headers=tuple(msg.headers() or ()), timestamp=ts if ts_type != 0 and ts >= 0 else None,
            )
            return rec if self.to_record is None else self.to_record(rec)
        except Exception as e:
            raise KafkaSourceError(
                f"{self._where()}: cannot read the record at offset {msg.offset()} of "
                f"{split_id(msg.topic(), msg.partition())} (key {msg.key()!r:.100}, value {msg.value()!r:.200}): "
                f"{type(e).__name__}: {e}"
            ) from e

    def records(self, msgs: list[Any]) -> list[Any]:
        """The pipeline's records for messages of one partition: one each, or in the batch form one batch."""
        if not self.batches:
            return [self.record(m) for m in msgs]
        if not msgs:
            return []
        try:
            return [record_batch([self.record(m) for m in msgs], **self._batch_shape)]
        except KafkaSourceError:
            raise
        except Exception as e:
            raise KafkaSourceError(
                f"{self._where()}: cannot make a batch of offsets {msgs[0].offset()}..{msgs[-1].offset()} of "
                f"{split_id(msgs[0].topic(), msgs[0].partition())}: {type(e).__name__}: {e}"
            ) from e

    # -- checkpoints and monitoring -------------------------------------------------------------------------------

    def snapshot_started(self, checkpoint_id: int) -> None:
        self._taking = checkpoint_id

    def offsets(self) -> dict[str, Any]:
        out = super().offsets()
        positions = out["split_positions"]
        for split, position in positions.items():
            if position is None and split in self._starts and not self._is_new(split):
                positions[split] = self._starts[split]  # not opened yet: where it starts
        if self._taking is not None and self.commit_offsets_on_checkpoint:
            self._checkpoint_positions[self._taking] = {
                s: p for s, p in out["split_positions"].items() if isinstance(p, int)
            }
        self._taking = None
        return out

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Commit the checkpoint's offsets to ``group_id`` (asynchronously; monitoring only)."""
        from confluent_kafka import KafkaException, TopicPartition

        done = sorted(c for c in self._checkpoint_positions if c <= checkpoint_id)
        positions = self._checkpoint_positions.get(checkpoint_id)
        for c in done:
            del self._checkpoint_positions[c]
        if positions is None or self._consumer is None:
            return
        offsets = [TopicPartition(*parse_split(s), p) for s, p in sorted(positions.items())]
        if not offsets:
            return
        try:
            self._consumer.commit(offsets=offsets, asynchronous=True)
            self.committed_checkpoints.append(checkpoint_id)
        except KafkaException as e:  # monitoring only: the checkpoint holds the offsets that count
            log.warning("%s: committing the offsets of checkpoint %d failed: %s", self._where(), checkpoint_id, e)

    def lag(self) -> dict[str, int | None]:
        """Per split this subtask reads: records behind the partition's end (its high watermark as the consumer
        last saw it, minus the split's position; None when not known yet). Asks the broker nothing."""
        return {r.split: r.lag() for r in list(self._readers.values())}

    def close(self) -> Any:
        super().close()
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()
        return None

    def release(self) -> None:
        self.close()  # the consumer stops (with its threads and broker connections) when its subtask ends, failed or not
