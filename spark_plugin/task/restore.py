"""Restoring a subtask from its part of a restore plan: the order of the steps; each part restores itself.

1. the operator chain loads operator state (keyed state: only the key groups of this subtask's range; other state:
   the old subtasks that map to this one) and positions its source (``OperatorChain.restore_slices``,
   ``position_source``),
2. the output partition queues the recovered **output** channel state in front of the output queues (re-sent
   before any new output; ``OutputPartition.restore``),
3. the input gate queues the recovered **input** channel state in front of the input channels
   (``InputGate.restore``); it hands it out before what the upstream subtasks re-send, and that before any new
   data (the recovery order of ``spark_plugin.network.input``),
4. the barrier handler learns the checkpoint restored, and the recovery order starts: the gate recovers, the
   partition marks the end of its recovered output on every channel.

A subtask may take checkpoints while it replays (``NetworkConfig.checkpoints_during_recovery``) unless the restore
moved records to another channel or subtask: then its recovery order spans channels, which one segment per channel
cannot record.

Without rescaling, recovered buffers are the exact bytes that travelled: nothing is re-serialized, reordered or
duplicated. How a rescaled restore redistributes them is in ``spark_plugin.network.recovered``.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.models import SubtaskRestore
from spark_plugin.network.recovered import FetchBlob, Recovered, RestoreMismatch
from spark_plugin.task.subtask import Subtask

__all__ = ["FetchBlob", "RestoreStats", "restore_subtask"]


@dataclass
class RestoreStats:
    checkpoint_id: int | None
    operator_blobs: int = 0
    output_buffers: int = 0
    input_buffers: int = 0
    restored_bytes: int = 0
    rerouted_records: int = 0
    """In-flight records that went to another channel or subtask than the one they were persisted for."""
    regenerated_inputs: int = 0
    """Logged inputs whose outputs were sent again (``spark_plugin.task.regeneration``)."""

    def add(self, outputs: Recovered, inputs: Recovered) -> None:
        self.output_buffers += outputs.buffers
        self.input_buffers += inputs.buffers
        self.restored_bytes += outputs.bytes + inputs.bytes
        self.rerouted_records += outputs.rerouted_records + inputs.rerouted_records


def restore_subtask(
    subtask: Subtask, part: SubtaskRestore, fetch: FetchBlob, checkpoint_id: int | None
) -> RestoreStats:
    """Apply ``part`` (this subtask's ``SubtaskRestore``) to a subtask that has not started its loop."""
    spec = subtask.spec
    stats = RestoreStats(checkpoint_id)
    stats.operator_blobs = subtask.chain.restore_slices(part.operator_state, fetch, spec.subtask_index, spec.parallelism)
    subtask.chain.position_source(part.source_offsets, part.source_positions)
    try:
        outputs = subtask.partition.restore(part.output_channel_state, fetch)
        inputs = subtask.gate.restore(
            part.input_channel_state, fetch, subtask.input_key_fns, spec.max_parallelism,
            subtask.keyed_range or subtask.key_group_range,
        )
    except RestoreMismatch as e:
        raise RestoreMismatch(f"restore of {spec.name}: {e}") from None
    stats.add(outputs, inputs)
    log, counts = subtask.chain.output_log, subtask.chain.input_counts
    if log is not None and log.restored:
        # the outputs the restored checkpoint's inputs regenerate go out first; the counts they carry are the old
        # attempt's, so no checkpoint may start before they all arrived (and at the consumers, below)
        stats.regenerated_inputs = log.replay(subtask.chain.bind)
        subtask.checkpoints.during_recovery = False
    if counts is not None and counts.restored:
        subtask.checkpoints.during_recovery = False
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
