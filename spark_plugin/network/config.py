"""Network sizing of the runtime: buffer size and buffers per channel, with Flink's defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NetworkConfig:
    """Buffer sizing for channels.

    The defaults follow Flink's network stack (``taskmanager.memory.segment-size`` 32 KiB,
    ``taskmanager.network.memory.buffers-per-channel`` 2, ``floating-buffers-per-gate`` 8,
    ``max-buffers-per-channel`` 10), so that behaviour under backpressure compares with a real engine.
    """

    buffer_size: int = 32 * 1024
    exclusive_buffers_per_channel: int = 2
    floating_buffers_per_gate: int = 8
    max_buffers_per_output_channel: int = 10
    flush_interval: float = 0.1
    """Seconds after which a partly filled output buffer is sent anyway (Flink's buffer timeout is 100 ms)."""
    checkpoints_during_recovery: bool = False
    """A restored subtask takes checkpoints while it still replays its restored in-flight data: what it has not
    replayed yet is written into the new checkpoint's channel state (Flink 2.x's FLIP-547, off by default there
    too). Off: the attempt takes no checkpoint until every subtask replayed everything. A restore that rescaled
    the job takes none during recovery either way (see docs/recovery.md)."""

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
