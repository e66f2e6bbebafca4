"""Restoring a subtask from its part of a restore plan, in the order recovery needs.

1. load operator state (keyed state: only the key groups of this subtask's range),
2. seek the source to the checkpoint's offsets,
3. queue the recovered **output** channel state in front of the output queues (re-sent before new output),
4. queue the recovered **input** channel state in front of each input channel (processed before new input).
Recovered buffers are the exact bytes that travelled, so nothing is re-serialized, reordered or duplicated.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spark_plugin.channel_state import ChannelStateReader
from spark_plugin.framing import count_records
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


def _segment_buffers(fetch: FetchBlob, seg: dict) -> list[bytes]:
    if seg["length"] == 0:
        return []
    data = fetch(seg["blob_id"], seg["offset"], seg["offset"] + seg["length"] - 1)
    return list(ChannelStateReader(data).buffers())


def restore_subtask(subtask: Subtask, plan: dict[str, Any], fetch: FetchBlob, checkpoint_id: int | None) -> RestoreStats:
    """Apply ``plan`` (a ``SubtaskRestore`` as a dict) to a subtask that has not started its loop."""
    stats = RestoreStats(checkpoint_id)
    index = subtask.spec.subtask_index
    for ref in plan.get("operator_state") or []:
        states = pickle.loads(fetch(ref["blob_id"], None, None))["operators"]
        stats.operator_blobs += 1
        for op in subtask.operators:
            state = states.get(op.id)
            if state is None:
                continue
            if op.keyed or ref.get("from_subtask") == index:
                op.restore(state)
    if subtask.source is not None and plan.get("source_offsets"):
        subtask.source.seek(plan["source_offsets"])
    outputs = {ch.info.name: ch for ch in subtask.outputs}
    for seg in plan.get("output_channel_state") or []:
        ch = outputs.get(seg["channel"])
        if ch is None:
            raise ValueError(
                f"restore of {subtask.spec.vertex}[{index}]: output channel {seg['channel']!r} of the checkpoint "
                "does not exist in this pipeline (rescaled or rewired?)"
            )
        buffers = _segment_buffers(fetch, seg)
        with subtask.lock:
            for b in buffers:
                ch.add_buffer(b, count_records(b))
        stats.output_buffers += len(buffers)
        stats.restored_bytes += sum(len(b) for b in buffers)
    inputs = {ch.info.name: ch.index for ch in subtask.gate.channels}
    recovered: dict[int, list[bytes]] = {}
    for seg in plan.get("input_channel_state") or []:
        if seg["channel"] not in inputs:
            raise ValueError(
                f"restore of {subtask.spec.vertex}[{index}]: input channel {seg['channel']!r} of the checkpoint "
                "does not exist in this pipeline (rescaled or rewired?)"
            )
        buffers = _segment_buffers(fetch, seg)
        recovered.setdefault(inputs[seg["channel"]], []).extend(buffers)
        stats.input_buffers += len(buffers)
        stats.restored_bytes += sum(len(b) for b in buffers)
    for channel, buffers in recovered.items():
        subtask.gate.prepend_recovered(channel, buffers)
    if checkpoint_id is not None:
        subtask.handler.latest_checkpoint_id = max(subtask.handler.latest_checkpoint_id, checkpoint_id)
    return stats
