"""Stream elements that travel in buffers between records: watermarks and watermark status (idle / active).

They are framed and pickled into the same buffers as the records around them (Flink's record writers serialize
watermarks into the same buffers too), so everything the network does to records it does to them: they use the
same credits, an aligned barrier queues behind them, an unaligned barrier overtakes them with the buffers that
hold them, and channel state persists them at their exact place among the records. A restore therefore replays
each channel's watermarks where they were, never ahead of or behind the records they came with.

The subtask loop recognises them by type (``type(x) in MARKERS``) and hands them to its event-time part instead of
its operators; operators never see them.
"""

from __future__ import annotations

from typing import Any

from spark_plugin.network.framing import decode_records, encode_records


class Watermark:
    """Event time up to ``timestamp`` (epoch ms, inclusive) is complete on this channel: no record with a timestamp
    at or before it follows, except late ones."""

    __slots__ = ("timestamp",)

    def __init__(self, timestamp: int) -> None:
        self.timestamp = timestamp

    def __reduce__(self) -> tuple:
        return (Watermark, (self.timestamp,))

    def __eq__(self, other: object) -> bool:
        return type(other) is Watermark and other.timestamp == self.timestamp

    def __hash__(self) -> int:
        return hash(("watermark", self.timestamp))

    def __repr__(self) -> str:
        return f"Watermark({self.timestamp})"


class WatermarkStatus:
    """The sender's watermark status changed: ``idle`` (it holds no watermark back until it sends records again) or
    active."""

    __slots__ = ("idle",)

    def __init__(self, idle: bool) -> None:
        self.idle = idle

    def __reduce__(self) -> tuple:
        return (WatermarkStatus, (self.idle,))

    def __eq__(self, other: object) -> bool:
        return type(other) is WatermarkStatus and other.idle == self.idle

    def __hash__(self) -> int:
        return hash(("status", self.idle))

    def __repr__(self) -> str:
        return "IDLE" if self.idle else "ACTIVE"


class Regenerated:
    """A record a restored subtask sent again from the inputs it logged (``spark_plugin.task.regeneration``): the
    ``count``-th record that ``producer`` (its subtask index in the restored checkpoint's attempt) sent for the
    record's key group. The consumer drops it when it had processed that many before the checkpoint."""

    __slots__ = ("producer", "count", "record")

    def __init__(self, producer: int, count: int, record: Any) -> None:
        self.producer = producer
        self.count = count
        self.record = record

    def __reduce__(self) -> tuple:
        return (Regenerated, (self.producer, self.count, self.record))

    def __repr__(self) -> str:
        return f"Regenerated({self.producer}, {self.count}, {self.record!r})"


IDLE = WatermarkStatus(True)
ACTIVE = WatermarkStatus(False)

MARKERS = frozenset((Watermark, WatermarkStatus))
"""The element types that are not records."""


def is_marker(element: Any) -> bool:
    return type(element) in MARKERS


def strip_markers(buffer: bytes) -> bytes:
    """The buffer without its watermarks and status markers (the same bytes when it holds none): for in-flight data
    that a rescaled restore sends over another channel than the one it travelled on, where its markers would no
    longer be in place."""
    elements = decode_records(buffer)
    if not any(type(e) in MARKERS for e in elements):
        return buffer
    return encode_records(e for e in elements if type(e) not in MARKERS)
