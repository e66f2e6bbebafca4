"""Restoring a subtask from its part of a restore plan, in the order recovery needs.

1. load operator state (keyed state: only the key groups of this subtask's range; other state: every slice),
2. seek the source to the checkpoint's offsets,
3. queue the recovered **output** channel state in front of the output queues (re-sent before new output),
4. queue the recovered **input** channel state in front of each input channel (processed before new input).

Without rescaling, recovered buffers are the exact bytes that travelled: nothing is re-serialized, reordered or
duplicated. When a buffer no longer fits the pipeline's channels (the plan comes from a different parallelism),
its records are routed again: input records of hash edges are kept only if their key group is this subtask's,
output records are partitioned again by the edge, and buffers of forward/rebalance edges are spread over the
channels of their edge.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spark_plugin.channel_state import ChannelStateReader
from spark_plugin.framing import count_records, decode_records, encode_records
from spark_plugin.keygroups import key_group
from spark_plugin.subtask import Subtask

FetchBlob = Callable[[str, int | None, int | None], bytes]
"""``fetch(blob_id, start, end)``: bytes ``start..end`` (inclusive) of a blob, or all of it."""


@dataclass
class RestoreStats:
    checkpoint_id: int | None
    operator_blobs: int = 0
    output_buffers: int = 0
    input_buffers: int = 0
    restored_bytes: int = 0
    rerouted_records: int = 0
    """In-flight records that went to another channel or subtask than the one they were persisted for."""


def _segment_buffers(fetch: FetchBlob, seg: dict) -> list[bytes]:
    if seg["length"] == 0:
        return []
    data = fetch(seg["blob_id"], seg["offset"], seg["offset"] + seg["length"] - 1)
    return list(ChannelStateReader(data).buffers())


def _restore_operators(subtask: Subtask, plan: dict[str, Any], fetch: FetchBlob, stats: RestoreStats) -> None:
    index = subtask.spec.subtask_index
    slices = sorted(plan.get("operator_state") or [], key=lambda r: (r.get("from_subtask") != index, r.get("from_subtask")))
    for ref in slices:
        states = pickle.loads(fetch(ref["blob_id"], None, None))["operators"]
        stats.operator_blobs += 1
        for op in subtask.operators:
            state = states.get(op.id)
            # keyed state: every slice (filtered by key group); other state: the old subtasks that map to this one
            if state is not None and (op.keyed or (ref.get("from_subtask") or 0) % subtask.spec.parallelism == index):
                op.restore(state)


def _restore_outputs(subtask: Subtask, plan: dict[str, Any], fetch: FetchBlob, stats: RestoreStats) -> None:
    by_name = {ch.info.name: ch for ch in subtask.outputs}
    writer_of = {}
    for w in subtask.writers:
        for ch in w.channels:
            writer_of[ch.info.name] = w
    spread: dict[str, int] = {}
    for seg in plan.get("output_channel_state") or []:
        buffers = _segment_buffers(fetch, seg)
        stats.output_buffers += len(buffers)
        stats.restored_bytes += sum(len(b) for b in buffers)
        ch = by_name.get(seg["channel"])
        writer = writer_of.get(seg["channel"]) or next(
            (w for w in subtask.writers if w.channels and w.channels[0].info.peer_vertex == seg.get("peer_vertex")),
            None,
        )
        if writer is None:
            raise ValueError(
                f"restore of {subtask.spec.vertex}[{subtask.spec.subtask_index}]: the checkpoint has output for "
                f"{seg.get('peer_vertex')!r} ({seg['channel']!r}), which this pipeline does not feed"
            )
        partitioning = seg.get("partitioning")
        if partitioning == "hash":
            position = writer.channels.index(ch) if ch is not None else None
            if position is None or any(writer.channel_of(r) != position for b in buffers for r in decode_records(b)):
                for b in buffers:  # partitioned for another parallelism: partition the records again
                    records = decode_records(b)
                    for r in records:
                        writer.emit(r)
                    stats.rerouted_records += len(records)
                writer.flush_all()
                continue
        if ch is None and partitioning == "broadcast":
            ch = next((c for c in writer.channels if c.info.peer_subtask == seg.get("peer_subtask")), None)
            if ch is None:
                continue  # a downstream subtask that no longer exists
        if ch is None:  # forward/rebalance buffers of a rescaled edge: whole buffers go round robin
            n = len(writer.channels)
            k = spread.get(seg.get("peer_vertex") or "", seg.get("from_subtask") or 0)
            with subtask.lock:
                for b in buffers:
                    writer.channels[k % n].add_buffer(b, count_records(b))
                    k += 1
            spread[seg.get("peer_vertex") or ""] = k
            continue
        with subtask.lock:
            for b in buffers:
                ch.add_buffer(b, count_records(b))


def _restore_inputs(subtask: Subtask, plan: dict[str, Any], fetch: FetchBlob, stats: RestoreStats) -> None:
    gate = subtask.gate
    index_of = {ch.info.name: ch.index for ch in gate.channels}
    head = subtask.operators[0]
    key_fn = getattr(head, "key_fn", None)
    kg_range = subtask.keyed_range
    maxp = subtask.spec.max_parallelism
    recovered: dict[int, list[bytes]] = {}
    for seg in plan.get("input_channel_state") or []:
        buffers = _segment_buffers(fetch, seg)
        stats.input_buffers += len(buffers)
        stats.restored_bytes += sum(len(b) for b in buffers)
        target = index_of.get(seg["channel"])
        if target is None:
            same_peer = [ch.index for ch in gate.channels if ch.info.peer_vertex == seg.get("peer_vertex")]
            if not same_peer:
                raise ValueError(
                    f"restore of {subtask.spec.vertex}[{subtask.spec.subtask_index}]: the checkpoint has input from "
                    f"{seg.get('peer_vertex')!r} ({seg['channel']!r}), which this pipeline does not read"
                )
            target = same_peer[(seg.get("from_subtask") or 0) % len(same_peer)]
            stats.rerouted_records += sum(count_records(b) for b in buffers)
        if seg.get("partitioning") == "hash" and key_fn is not None and kg_range is not None:
            lo, hi = kg_range
            kept: list[bytes] = []
            for b in buffers:
                records = decode_records(b)
                mine = [r for r in records if lo <= key_group(key_fn(r), maxp) <= hi]
                if len(mine) == len(records):
                    kept.append(b)  # the usual case: the exact bytes
                elif mine:
                    kept.append(encode_records(mine))
                stats.rerouted_records += len(records) - len(mine)
            buffers = kept
        recovered.setdefault(target, []).extend(buffers)
    for channel, buffers in recovered.items():
        gate.prepend_recovered(channel, buffers)


def restore_subtask(subtask: Subtask, plan: dict[str, Any], fetch: FetchBlob, checkpoint_id: int | None) -> RestoreStats:
    """Apply ``plan`` (a ``SubtaskRestore`` as a dict) to a subtask that has not started its loop."""
    stats = RestoreStats(checkpoint_id)
    _restore_operators(subtask, plan, fetch, stats)
    if subtask.source is not None and plan.get("source_offsets"):
        subtask.source.seek(plan["source_offsets"])
    _restore_outputs(subtask, plan, fetch, stats)
    _restore_inputs(subtask, plan, fetch, stats)
    if checkpoint_id is not None:
        subtask.handler.latest_checkpoint_id = max(subtask.handler.latest_checkpoint_id, checkpoint_id)
    subtask.restore_stats = stats
    return stats
