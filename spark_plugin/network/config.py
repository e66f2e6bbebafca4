"""Network sizing of the runtime: buffer size and buffers per channel, with Flink's defaults, and buffer debloating."""

from __future__ import annotations

import math
from dataclasses import dataclass

from contract.channel_state import check_codec

BACKLOG = 1
"""Buffers an output channel may queue beyond the credit its receiver granted (Flink's subpartition backlog): one
buffer ready to go the moment a credit arrives, no more. The rest of a backpressured pipeline's data waits upstream,
unserialized, instead of in flight where every unaligned checkpoint would persist it."""


@dataclass(frozen=True)
class NetworkConfig:
    """Buffer sizing for channels.

    The defaults follow Flink's network stack (``taskmanager.memory.segment-size`` 32 KiB,
    ``taskmanager.network.memory.buffers-per-channel`` 2, ``floating-buffers-per-gate`` 8,
    ``max-buffers-per-channel`` 10), so that behaviour under backpressure compares with a real engine.

    Buffer debloating (Flink's FLIP-183) is off by default; with ``debloat_target_s`` set, each receiver measures
    the throughput of its input gate and sizes buffers so that the buffers in use hold about that many seconds of
    it, announcing the size to its senders, which then cut smaller buffers (never larger than ``buffer_size``).
    """

    buffer_size: int = 32 * 1024
    exclusive_buffers_per_channel: int = 2
    floating_buffers_per_gate: int = 8
    max_buffers_per_output_channel: int = 10
    output_backlog_buffers: int | None = BACKLOG
    """Buffers an output channel may queue beyond its receiver's credit (the sender's credit bound, Flink's
    subpartition backlog). None: no bound, an output channel queues up to ``max_buffers_per_output_channel``
    whatever its credit, as before the bound; every unaligned checkpoint then persists those buffers too. Kept for
    comparison: ``overtake bench adaptive`` runs ``unaligned`` with and without it (``WaveSettings.unbounded``)."""
    flush_interval: float = 0.1
    """Seconds after which a partly filled output buffer is sent anyway (Flink's buffer timeout is 100 ms)."""
    debloat_target_s: float | None = None
    """Seconds of throughput the in-flight buffers of an input gate should hold (Flink's
    ``buffer-debloat.target``, 1 s there); None: buffers keep ``buffer_size``."""
    debloat_period_s: float = 0.2
    """How often a receiver recomputes its buffer size (Flink's ``buffer-debloat.period``)."""
    debloat_min_buffer_size: int = 256
    """The smallest buffer size debloating may choose (Flink's ``memory.min-segment-size``)."""
    debloat_threshold_percent: int = 25
    """A new size is announced only when it differs from the announced one by more than this (Flink's
    ``buffer-debloat.threshold-percentages``)."""
    debloat_samples: int = 20
    """Samples of the moving average that smooths the size (Flink's ``buffer-debloat.samples``)."""
    checkpoints_during_recovery: bool = True
    """A restored subtask takes checkpoints while it still replays its restored in-flight data: what it has not
    replayed yet is written into the new checkpoint's channel state (Flink 2.x's FLIP-547, which is off by default
    there). Off: the attempt takes no checkpoint until every subtask replayed everything, so a second failure
    during a long replay starts over from the same checkpoint. A restore that rescaled the job takes none during
    recovery either way (see docs/recovery.md, "Checkpoints during recovery")."""
    ack_relay: bool = True
    """The subtasks of one host send their acks through one task's relay, which sends the acks that are waiting as
    one request per checkpoint (``spark_plugin.task.ack_relay``). Off: every subtask sends its own ack requests."""
    channel_state_compression: str | None = None
    """The codec persisted channel state is compressed with, each buffer on its own: ``"lz4"`` (the LZ4 frame
    format) or ``"zstd"``, through pyarrow; None (the default): stored as the buffers travelled. Restores read
    what each segment says, so a job may change it between attempts (see docs/recovery.md, "Compressed channel
    state")."""

    def __post_init__(self) -> None:
        if self.buffer_size < 64:
            raise ValueError(f"buffer_size {self.buffer_size} is too small; use at least 64 bytes")
        if self.exclusive_buffers_per_channel < 1:
            raise ValueError(
                f"exclusive_buffers_per_channel {self.exclusive_buffers_per_channel} must be at least 1 "
                "or no channel could ever receive a buffer"
            )
        if self.floating_buffers_per_gate < 0:
            raise ValueError(f"floating_buffers_per_gate {self.floating_buffers_per_gate} must not be negative")
        if self.max_buffers_per_output_channel < 1:
            raise ValueError(
                f"max_buffers_per_output_channel {self.max_buffers_per_output_channel} must be at least 1"
            )
        if not 0 <= self.flush_interval < math.inf:  # NaN too: the loop's wake-up time would be NaN
            raise ValueError(
                f"flush_interval {self.flush_interval!r} must be a finite number of seconds, at least 0 (0: send a "
                "partly filled buffer whenever its channel can take it; Flink's buffer timeout is 0.1)"
            )
        if self.output_backlog_buffers is not None and self.output_backlog_buffers < 0:
            raise ValueError(
                f"output_backlog_buffers {self.output_backlog_buffers} must not be negative (None: no credit bound)"
            )
        self._check_debloating()
        check_codec(self.channel_state_compression)

    def _check_debloating(self) -> None:
        target = self.debloat_target_s
        if target is not None and not target > 0:
            raise ValueError(
                f"debloat_target_s {target!r} must be a positive number of seconds (e.g. 1.0), "
                "or None to keep buffers at buffer_size"
            )
        if not self.debloat_period_s > 0:
            raise ValueError(
                f"debloat_period_s {self.debloat_period_s!r} must be a positive number of seconds (Flink uses 0.2)"
            )
        if self.debloat_min_buffer_size < 64:
            raise ValueError(f"debloat_min_buffer_size {self.debloat_min_buffer_size} is too small; use at least 64 bytes")
        if target is not None and self.debloat_min_buffer_size > self.buffer_size:
            raise ValueError(
                f"debloat_min_buffer_size {self.debloat_min_buffer_size} is larger than buffer_size "
                f"{self.buffer_size}: debloating chooses sizes between the two, so make it at most buffer_size"
            )
        if not 0 <= self.debloat_threshold_percent < 100:
            raise ValueError(
                f"debloat_threshold_percent {self.debloat_threshold_percent} must be from 0 to 99 (percent of "
                "the announced size a new size must differ by before it is announced)"
            )
        if self.debloat_samples < 1:
            raise ValueError(f"debloat_samples {self.debloat_samples} must be at least 1")

    @property
    def debloating(self) -> bool:
        return self.debloat_target_s is not None

    def output_buffers_bound(self) -> int:
        """The most finished buffers an output channel holds: what its receiver can grant (its exclusive buffers
        and every floating buffer of the gate) plus the backlog, capped by ``max_buffers_per_output_channel``."""
        if self.output_backlog_buffers is None:
            return self.max_buffers_per_output_channel
        granted = self.exclusive_buffers_per_channel + self.floating_buffers_per_gate
        return min(self.max_buffers_per_output_channel, granted + self.output_backlog_buffers)

    def inflight_capacity_bytes(self, inputs: int, outputs: int) -> int:
        """The most in-flight bytes a subtask with ``inputs`` input and ``outputs`` output channels can persist in
        one unaligned checkpoint with this sizing (debloating only makes it less): its input gate's buffers, and
        per output channel its bound of finished buffers plus the partly filled one flushed before the barrier."""
        buffers = inputs * self.exclusive_buffers_per_channel + (self.floating_buffers_per_gate if inputs else 0)
        buffers += outputs * (self.output_buffers_bound() + 1)
        return buffers * self.buffer_size
