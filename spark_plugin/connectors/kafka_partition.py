"""One partition of a Kafka source subtask's consumer as a split reader: the records fetched for it and not yet
returned, its position (the offset after the last record returned, never after the last one fetched; in the batch
form, after the batch's last record), and its pausing in the consumer when its buffer is full.

The runtime's pause (backpressure) does not pause the partition in the consumer: the consumer keeps fetching ahead,
into librdkafka's queue and this buffer, so that when the runtime takes records again they are here at once. Pausing
the partition in the consumer drops what librdkafka fetched ahead, and resuming it costs a fetch round trip (some
170 ms on the test broker): under steady backpressure the runtime pauses and resumes a source several times a
second, and the slow stage downstream sat idle for each round trip (`overtake bench kafka`, "starved"). What is
fetched ahead is bounded by ``BUFFERED`` records per split (then the partition is paused in the consumer) and by
librdkafka's own queue limits (``queued.max.messages.kbytes``, settable through the source's ``config``)."""

from __future__ import annotations

from collections import deque
from typing import Any

from spark_plugin.connectors.base import SplitReader

BUFFERED = 1000
"""Records a split buffers beyond what the runtime took before its partition is paused in the consumer."""


class PartitionReader(SplitReader):
    """One partition of the source's consumer: the records fetched for it and not yet returned, its position.
    ``source`` is the ``KafkaSource`` whose consumer fetches for every reader of the subtask."""

    def __init__(self, source: Any, split: str, topic: str, partition: int, offset: int,
                 end: int | None, skip_before: int | None) -> None:
        self.source, self.split, self.topic, self.partition = source, split, topic, partition
        self.next = offset  # the position: the offset after the last record returned
        self.fetched = offset  # the offset after the last message (or end of partition) fetched for it
        self.end = end
        self.skip_before = skip_before
        self.buffer: deque[Any] = deque()
        self.paused = False  # by the runtime (backpressure): it takes nothing; the consumer still fetches ahead
        self.full = False  # by this reader: its buffer is full
        self.closed = False

    def fetched_record(self, msg: Any) -> None:
        if msg.offset() < self.fetched:
            return  # fetched again after a pause: returned already
        self.buffer.append(msg)
        self.fetched = msg.offset() + 1
        if not self.full and len(self.buffer) >= BUFFERED:
            self.full = True
            self._update_consumer()

    def at_end(self, offset: int) -> None:
        """The consumer reached the partition's end at ``offset`` (past any transaction markers)."""
        if offset > self.fetched:
            self.fetched = offset

    def _update_consumer(self) -> None:
        self.source._set_paused(self, self.full)

    def poll(self, max_records: int) -> list[Any] | None:
        if self.end is not None and self.next >= self.end:
            return None
        if not self.buffer:
            self.source._fetch()
        limit = self.source.batch_rows if self.source.batches else max_records  # the batch form: one batch's rows
        out: list[Any] = []
        while self.buffer and len(out) < limit:
            msg = self.buffer.popleft()
            if self.end is not None and msg.offset() >= self.end:
                self.buffer.clear()
                self.next = self.end
                break
            self.next = msg.offset() + 1
            if self.skip_before is not None:
                ts_type, ts = msg.timestamp()
                if ts_type != 0 and 0 <= ts < self.skip_before:
                    continue  # before the start timestamp
                self.skip_before = None
            out.append(msg)
        if not self.buffer:
            self.next = max(self.next, self.fetched if self.end is None else min(self.fetched, self.end))
            if self.full:
                self.full = False
                self._update_consumer()
        if not out and self.end is not None and self.next >= self.end:
            return None
        return self.source.records(out)

    def position(self) -> Any:
        if self.skip_before is not None:
            return {"offset": self.next, "skip_before": self.skip_before}
        return self.next

    def wait_hint(self) -> float | None:
        return None if self.buffer else 0.01

    def lag(self) -> int | None:
        from confluent_kafka import TopicPartition

        try:
            _, high = self.source._consumer.get_watermark_offsets(TopicPartition(self.topic, self.partition), cached=True)
        except Exception:  # noqa: BLE001  (nothing cached yet, or the consumer is gone)
            return None
        return None if high is None or high < 0 else max(high - self.next, 0)

    def pause(self) -> None:
        self.paused = True  # the consumer keeps fetching ahead, up to ``BUFFERED`` (see the module's docstring)

    def resume(self) -> None:
        self.paused = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.buffer.clear()
            self.source._unassign(self)

