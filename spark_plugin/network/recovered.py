"""Recovered channel state: a restore plan's segments read back into buffers, in order (Flink's
``SequentialChannelStateReader``), and the rules that send them to a channel after a rescale.

The input gate and the output partition restore themselves with these (``InputGate.restore``,
``OutputPartition.restore``); the task only orders the steps (``spark_plugin.task.restore``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contract.channel_state import spans, unpack
from contract.keygroups import KEY_HASH_VERSION, key_group
from contract.models import Partitioning, RestoreSegment
from spark_plugin.network.elements import is_marker
from spark_plugin.network.framing import count_records, decode_records, encode_records
from spark_plugin.plan.topology import ChannelInfo

FetchBlob = Callable[[str, int | None, int | None], bytes]
"""``fetch(blob_id, start, end)``: bytes ``start..end`` (inclusive) of a blob, or all of it."""


class RestoreMismatch(ValueError):
    """The checkpoint holds channel state for a channel this pipeline no longer has (nor any channel like it)."""


@dataclass
class Recovered:
    """What one part queued of the channel state it restored."""

    buffers: int = 0
    bytes: int = 0
    rerouted_records: int = 0
    """Records that went to another channel or subtask than the one they were persisted for."""

    def count(self, buffers: list[bytes]) -> None:
        self.buffers += len(buffers)
        self.bytes += sum(len(b) for b in buffers)


def segment_buffers(fetch: FetchBlob, segment: RestoreSegment) -> list[bytes]:
    """The buffers a segment persisted, in order: one run of its own blob, or (incremental channel state) the runs
    of its parts, each in its own blob or in a blob of an earlier checkpoint; inflated when the segment names the
    codec it was compressed with."""
    if segment.length == 0:
        return []
    if segment.parts:
        data = b"".join(
            fetch(p.blob_id or segment.blob_id, p.offset, p.offset + p.length - 1)
            for p in segment.parts
        )
    else:
        data = fetch(segment.blob_id, segment.offset, segment.offset + segment.length - 1)
    found, stop = spans(data, 0, len(data))
    if stop != len(data):
        raise ValueError(f"channel state is truncated: the buffer at {stop} passes the segment's end {len(data)}")
    view = memoryview(data)
    if segment.codec is not None:
        return [unpack(segment.codec, view[start:end]) for start, end in found]
    return [bytes(view[start:end]) for start, end in found]


def keep_key_groups(
    buffers: list[bytes], key_fn: Callable[[Any], Any], max_parallelism: int, own: tuple[int, int],
    persisted_for: tuple[int | None, int | None] = (None, None),
) -> tuple[list[bytes], int]:
    """The records of ``buffers`` whose key group is in ``own``, in order, and how many were left out.

    ``persisted_for`` is the key-group range of the subtask that persisted them: when it lies within ``own`` the
    buffers are kept as they are (the exact bytes), otherwise every record is looked at. A record whose key group
    lies outside ``persisted_for`` was routed by another key hash (a checkpoint of an older version): only the
    subtasks overlapping that range are sent the segment, so none might keep it, and the restore fails instead.
    """
    lo, hi = own
    start, end = persisted_for
    if start is not None and end is not None and lo <= start and end <= hi:
        return buffers, 0

    def group_is_mine(g: int, what: str) -> bool:
        if start is not None and end is not None and not start <= g <= end:
            raise RestoreMismatch(
                f"{what} is in key group {g}, outside the key "
                f"groups {start}..{end} of the subtask that persisted it: it was routed by another key hash, e.g. "
                f"in a checkpoint taken before key hash version {KEY_HASH_VERSION}; restore this checkpoint with the "
                "keyed stage at parallelism 1 (docs/recovery.md, \"Key groups and key hashing\")"
            )
        return lo <= g <= hi

    def is_mine(record: Any) -> bool:
        if is_marker(record):
            return True
        key = key_fn(record)
        return group_is_mine(key_group(key, max_parallelism), f"an in-flight record's key {key!r} "
                                                              f"({type(key).__name__})")

    split = getattr(key_fn, "split_rows", None)

    def row_is_mine(g: int) -> bool:
        return group_is_mine(g, "a row of an in-flight keyed batch")

    def mine_of(records: list[Any]) -> tuple[list[Any], bool, int]:
        """The records to keep, whether they are ``records`` unchanged, and how many (parts) were left out."""
        if split is None:
            mine = [r for r in records if is_mine(r)]
            return mine, len(mine) == len(records), len(records) - len(mine)
        # records of rows with many keys (keyed batches): keep each record's rows of the key groups in ``own``
        mine, whole, left_out = [], True, 0
        for r in records:
            if is_marker(r):
                mine.append(r)
                continue
            parts = split(r, max_parallelism, row_is_mine)
            if not (len(parts) == 1 and parts[0][0] and parts[0][1] is r):
                whole = False
            for keep, part in parts:
                if keep:
                    mine.append(part)
                else:
                    left_out += 1
        return mine, whole, left_out

    kept: list[bytes] = []
    dropped = 0
    for b in buffers:
        records = decode_records(b)
        mine, whole, left_out = mine_of(records)
        if whole:
            kept.append(b)  # the usual case: the exact bytes
        elif mine:
            kept.append(encode_records(mine))
        dropped += left_out
    return kept, dropped


def input_channel_for(segment: RestoreSegment, channels: list[ChannelInfo]) -> int | None:
    """The input channel that replays a recovered input segment: the same channel when it still exists, else a
    channel from the same upstream vertex (from the same upstream subtask if there is one); None when this
    subtask reads nothing from that vertex. Which one does not change the order: all recovered input is replayed
    before anything else."""
    for index, info in enumerate(channels):
        if info.name == segment.channel:
            return index
    same_vertex = [i for i, info in enumerate(channels) if info.peer_vertex == segment.peer_vertex]
    if not same_vertex:
        return None
    same_subtask = [i for i in same_vertex if channels[i].peer_subtask == segment.peer_subtask]
    if same_subtask:
        return same_subtask[0]
    return same_vertex[(segment.peer_subtask or 0) % len(same_vertex)]


def route_input(
    segments: list[RestoreSegment],
    fetch: FetchBlob,
    channels: list[ChannelInfo],
    key_fns: dict[str, Callable[[Any], Any]],
    max_parallelism: int,
    own: tuple[int, int],
) -> tuple[dict[int, list[bytes]], Recovered]:
    """The recovered input buffers of each input channel, in order, and what they count.

    A segment goes to its own channel, or after a rescale to a channel from the same upstream vertex; records of a
    hash edge (``key_fns``: its key selector by upstream vertex) stay only where their key group is in ``own``."""
    done = Recovered()
    recovered: dict[int, list[bytes]] = {}
    for seg in segments:
        buffers = segment_buffers(fetch, seg)
        done.count(buffers)
        target = input_channel_for(seg, channels)
        if target is None:
            raise RestoreMismatch(
                f"the checkpoint has input from {seg.peer_vertex!r} ({seg.channel!r}), which this pipeline does not "
                f"read"
            )
        if channels[target].name != seg.channel:
            done.rerouted_records += sum(count_records(b) for b in buffers)
        key_fn = key_fns.get(seg.peer_vertex or "")
        if seg.partitioning == Partitioning.hash and key_fn is not None:
            buffers, dropped = keep_key_groups(
                buffers, key_fn, max_parallelism, own, (seg.key_group_start, seg.key_group_end)
            )
            done.rerouted_records += dropped
        recovered.setdefault(target, []).extend(buffers)
    return recovered, done
