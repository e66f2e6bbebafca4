"""Restoring a subtask from its part of a restore plan, in the order recovery needs.

1. load operator state (keyed state: only the key groups of this subtask's range; other state: the old subtasks
   that map to this one),
2. position the source: at its own offsets, or, when its vertex was rescaled, at the splits it owns now out of
   every old source subtask's positions,
3. queue the recovered **output** channel state in front of the output queues (re-sent before any new output),
   followed by a ``RECOVERY_END`` marker on every output channel,
4. queue the recovered **input** channel state in front of the input channels; the gate hands it out before
   what the upstream subtasks re-send, and that before any new data (the recovery order of
   ``spark_plugin.network.input``).

A subtask may take checkpoints while it replays (``NetworkConfig.checkpoints_during_recovery``) unless the restore
moved records to another channel or subtask: then its recovery order spans channels, which one segment per channel
cannot record.

Without rescaling, recovered buffers are the exact bytes that travelled: nothing is re-serialized, reordered or
duplicated. When the plan comes from another parallelism: records of hash edges are kept only where their key
group now belongs (input state) or partitioned again for the new downstream parallelism (output state); buffers
of forward and rebalance edges are spread over the channels of their edge; broadcast state stays per receiver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contract.keygroups import key_group
from spark_plugin.network.elements import is_marker, strip_markers
from spark_plugin.network.framing import count_records, decode_records, encode_records
from spark_plugin.plan.topology import ChannelInfo
from spark_plugin.task.channel_state import ChannelStateReader
from spark_plugin.task.subtask import Subtask

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
    if seg.get("parts"):  # incremental channel state: runs of its own blob and of earlier checkpoints' blobs
        data = b"".join(
            fetch(p.get("blob_id") or seg["blob_id"], p["offset"], p["offset"] + p["length"] - 1) for p in seg["parts"]
        )
    else:
        data = fetch(seg["blob_id"], seg["offset"], seg["offset"] + seg["length"] - 1)
    return list(ChannelStateReader(data).buffers())


# ====================================================================================== redistribution (pure)


def keep_key_groups(
    buffers: list[bytes], key_fn: Callable[[Any], Any], max_parallelism: int, own: tuple[int, int],
    persisted_for: tuple[int | None, int | None] = (None, None),
) -> tuple[list[bytes], int]:
    """The records of ``buffers`` whose key group is in ``own``, in order, and how many were left out.

    ``persisted_for`` is the key-group range of the subtask that persisted them: when it lies within ``own`` the
    buffers are kept as they are (the exact bytes), otherwise every record is looked at.
    """
    lo, hi = own
    start, end = persisted_for
    if start is not None and end is not None and lo <= start and end <= hi:
        return buffers, 0
    kept: list[bytes] = []
    dropped = 0
    for b in buffers:
        records = decode_records(b)
        mine = [r for r in records if is_marker(r) or lo <= key_group(key_fn(r), max_parallelism) <= hi]
        if len(mine) == len(records):
            kept.append(b)  # the usual case: the exact bytes
        elif mine:
            kept.append(encode_records(mine))
        dropped += len(records) - len(mine)
    return kept, dropped


def input_channel_for(segment: dict, channels: list[ChannelInfo]) -> int | None:
    """The input channel that replays a recovered input segment: the same channel when it still exists, else a
    channel from the same upstream vertex (from the same upstream subtask if there is one); None when this
    subtask reads nothing from that vertex. Which one does not change the order: all recovered input is replayed
    before anything else."""
    for index, info in enumerate(channels):
        if info.name == segment["channel"]:
            return index
    same_vertex = [i for i, info in enumerate(channels) if info.peer_vertex == segment.get("peer_vertex")]
    if not same_vertex:
        return None
    same_subtask = [i for i in same_vertex if channels[i].peer_subtask == segment.get("peer_subtask")]
    if same_subtask:
        return same_subtask[0]
    return same_vertex[(segment.get("peer_subtask") or 0) % len(same_vertex)]


# ====================================================================================== applying a plan


def _restore_operators(subtask: Subtask, plan: dict[str, Any], fetch: FetchBlob, stats: RestoreStats) -> None:
    index = subtask.spec.subtask_index
    slices = sorted(plan.get("operator_state") or [], key=lambda r: (r.get("from_subtask") != index, r.get("from_subtask")))
    for ref in slices:
        # keyed state: every slice (filtered by key group); other state: the old subtasks that map to this one
        keyed_only = (ref.get("from_subtask") or 0) % subtask.spec.parallelism != index
        subtask.chain.restore(fetch(ref["blob_id"], None, None), keyed_only)
        stats.operator_blobs += 1


def _restore_source(subtask: Subtask, plan: dict[str, Any]) -> None:
    source = subtask.chain.source
    if source is None:
        return
    positions = plan.get("source_positions") or []
    if positions:
        source.restore_positions([p["offsets"] for p in sorted(positions, key=lambda p: p["from_subtask"])])
    elif plan.get("source_offsets"):
        source.seek(plan["source_offsets"])


def _restore_outputs(subtask: Subtask, plan: dict[str, Any], fetch: FetchBlob, stats: RestoreStats) -> None:
    partition = subtask.partition
    by_name = {ch.info.name: ch for ch in partition.channels}
    writer_of = {ch.info.name: w for w in partition.writers for ch in w.channels}
    spread: dict[str, int] = {}
    for seg in plan.get("output_channel_state") or []:
        buffers = _segment_buffers(fetch, seg)
        stats.output_buffers += len(buffers)
        stats.restored_bytes += sum(len(b) for b in buffers)
        ch = by_name.get(seg["channel"])
        writer = writer_of.get(seg["channel"]) or next(
            (w for w in partition.writers if w.channels and w.channels[0].info.peer_vertex == seg.get("peer_vertex")),
            None,
        )
        if writer is None:
            raise ValueError(
                f"restore of {subtask.spec.name}: the checkpoint has output for {seg.get('peer_vertex')!r} "
                f"({seg['channel']!r}), which this pipeline does not feed"
            )
        partitioning = seg.get("partitioning")
        if partitioning == "hash":
            position = writer.channels.index(ch) if ch is not None else None
            if position is None or any(
                writer.channel_of(r) != position for b in buffers for r in decode_records(b) if not is_marker(r)
            ):
                for b in buffers:  # partitioned for another parallelism: partition the records again
                    # (watermarks are dropped: the subtask sends its restored watermark behind these records)
                    records = [r for r in decode_records(b) if not is_marker(r)]
                    for r in records:
                        writer.emit(r)
                    stats.rerouted_records += len(records)
                writer.flush_all()
                continue
        if ch is None and partitioning == "broadcast":
            ch = next((c for c in writer.channels if c.info.peer_subtask == seg.get("peer_subtask")), None)
            if ch is None:
                continue  # a downstream subtask that no longer exists (it got every record on its own channel too)
        if ch is None:  # forward/rebalance buffers of a rescaled edge: whole buffers go round robin
            n = len(writer.channels)
            k = spread.get(seg.get("peer_vertex") or "", seg.get("from_subtask") or 0)
            with subtask.lock:
                for b in buffers:
                    b = strip_markers(b)  # on another channel its watermarks would be out of place
                    writer.channels[k % n].add_buffer(b, count_records(b))
                    k += 1
            spread[seg.get("peer_vertex") or ""] = k
            continue
        with subtask.lock:
            for b in buffers:
                ch.add_buffer(b, count_records(b))


def _restore_inputs(subtask: Subtask, plan: dict[str, Any], fetch: FetchBlob, stats: RestoreStats) -> None:
    gate = subtask.gate
    infos = [ch.info for ch in gate.channels]
    own = subtask.keyed_range or subtask.key_group_range
    recovered: dict[int, list[bytes]] = {}
    for seg in plan.get("input_channel_state") or []:
        buffers = _segment_buffers(fetch, seg)
        stats.input_buffers += len(buffers)
        stats.restored_bytes += sum(len(b) for b in buffers)
        target = input_channel_for(seg, infos)
        if target is None:
            raise ValueError(
                f"restore of {subtask.spec.name}: the checkpoint has input from {seg.get('peer_vertex')!r} "
                f"({seg['channel']!r}), which this pipeline does not read"
            )
        if infos[target].name != seg["channel"]:
            stats.rerouted_records += sum(count_records(b) for b in buffers)
        key_fn = subtask.input_key_fns.get(seg.get("peer_vertex") or "")
        if seg.get("partitioning") == "hash" and key_fn is not None:
            buffers, dropped = keep_key_groups(
                buffers, key_fn, subtask.spec.max_parallelism, own,
                (seg.get("key_group_start"), seg.get("key_group_end")),
            )
            stats.rerouted_records += dropped
        recovered.setdefault(target, []).extend(buffers)
    for channel, buffers in recovered.items():
        gate.prepend_recovered(channel, buffers)


def restore_subtask(subtask: Subtask, plan: dict[str, Any], fetch: FetchBlob, checkpoint_id: int | None) -> RestoreStats:
    """Apply ``plan`` (a ``SubtaskRestore`` as a dict) to a subtask that has not started its loop."""
    stats = RestoreStats(checkpoint_id)
    _restore_operators(subtask, plan, fetch, stats)
    _restore_source(subtask, plan)
    _restore_outputs(subtask, plan, fetch, stats)
    _restore_inputs(subtask, plan, fetch, stats)
    if checkpoint_id is not None:
        subtask.handler.restored(checkpoint_id)
    if stats.rerouted_records:
        # restored records changed channel or subtask (a rescale): only the gate's recovery order keeps their keys
        # in order, and a checkpoint's channel state, one segment per channel, could not keep it for a later restore
        subtask.checkpoints.during_recovery = False
    # the recovery order: this subtask's recovered input first, then what its upstreams re-send, then new data
    subtask.gate.start_recovery()
    subtask.partition.end_recovery()
    subtask.restore_stats = stats
    return stats
