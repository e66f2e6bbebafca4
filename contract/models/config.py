"""A job's checkpoint configuration: the barrier policy, the trigger interval, timeouts, retention and the
in-flight budget, with the ranges each setting takes."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import (
    Field,
    field_validator,
)

from contract.models.base import (
    MAX_CONFIG_MS,
    MAX_FIGURE,
    _Model,
    _range,
)


class BarrierPolicy(str, Enum):
    aligned = "aligned"
    unaligned = "unaligned"
    aligned_then_unaligned = "aligned_then_unaligned"
    unaligned_last_barrier = "unaligned_last_barrier"
    """Barriers overtake input queues; a subtask snapshots when its last barrier arrived and forwards in band, so it
    persists the inputs its barriers overtook and none of its outputs (for operators with many outputs per input)."""
    adaptive = "adaptive"
    """Chosen by the coordinator per checkpoint: aligned (with an alignment budget) or unaligned, from recent
    alignment times, backpressure and persisted bytes; a barrier carries the chosen policy, never this one."""


CONFIG_RANGES: dict[str, tuple[int, int, str]] = {
    "interval": (1, MAX_CONFIG_MS, "must be positive (ms) or null"),
    "timeout": (1, MAX_CONFIG_MS, "must be positive (ms)"),
    "min_pause": (0, MAX_CONFIG_MS, "must not be negative (ms)"),
    "max_concurrent": (1, 1000, "must be at least 1"),
    "alignment_timeout": (0, MAX_CONFIG_MS - 1, "must not be negative (ms)"),
    "tolerable_failures": (0, 1_000_000, "must not be negative"),
    "retained": (1, 1000, "must be at least 1"),
    "max_inflight_bytes_per_subtask": (0, MAX_FIGURE, "must not be negative (bytes) or null"),
    "max_inflight_bytes": (0, MAX_FIGURE, "must not be negative (bytes) or null"),
}


OverInflightBudget = Literal["align", "abort"]


class CheckpointConfig(_Model):
    interval: int | None = Field(
        default=None,
        description="Periodic trigger interval in ms; null disables periodic checkpoints.",
        **_range(*CONFIG_RANGES["interval"][:2]),
    )
    timeout: int = Field(
        default=600_000,
        description="A checkpoint pending longer than this (ms) is aborted.",
        **_range(*CONFIG_RANGES["timeout"][:2]),
    )
    min_pause: int = Field(
        default=0,
        description="Minimum pause (ms) between the end of one checkpoint and the next trigger.",
        **_range(*CONFIG_RANGES["min_pause"][:2]),
    )
    max_concurrent: int = Field(
        default=1, description="Maximum number of pending checkpoints.", **_range(*CONFIG_RANGES["max_concurrent"][:2])
    )
    policy: BarrierPolicy = BarrierPolicy.aligned_then_unaligned
    alignment_timeout: int | None = Field(
        default=None,
        description="For aligned_then_unaligned: ms after the trigger at which alignment switches to unaligned "
        "(below timeout). For adaptive: the alignment budget (default 1000 ms, at most half the timeout).",
        **_range(*CONFIG_RANGES["alignment_timeout"][:2]),
    )
    tolerable_failures: int = Field(
        default=0,
        description="Consecutive failed checkpoints tolerated before the job is marked failing.",
        **_range(*CONFIG_RANGES["tolerable_failures"][:2]),
    )
    retained: int = Field(
        default=1,
        description="Completed checkpoints kept (savepoints are never collected).",
        **_range(*CONFIG_RANGES["retained"][:2]),
    )
    incremental_channel_state: bool = Field(
        default=False,
        description="Unaligned checkpoints reference in-flight buffers that the previous completed checkpoint "
        "already persisted instead of writing them again (state written straight into the blob store only; "
        "savepoints always write everything).",
    )
    max_inflight_bytes_per_subtask: int | None = Field(
        default=None,
        description="In-flight budget: the most bytes of in-flight data one subtask persists for one unaligned "
        "checkpoint; a subtask that would pass it takes that checkpoint aligned (see over_inflight_budget). "
        "Null: no limit.",
        **_range(*CONFIG_RANGES["max_inflight_bytes_per_subtask"][:2]),
    )
    max_inflight_bytes: int | None = Field(
        default=None,
        description="In-flight budget of the whole job per checkpoint, shared equally by its subtasks (each gets "
        "the smaller of this divided by the number of subtasks and max_inflight_bytes_per_subtask). Null: no limit.",
        **_range(*CONFIG_RANGES["max_inflight_bytes"][:2]),
    )
    over_inflight_budget: OverInflightBudget = Field(
        default="align",
        description="What a subtask does when the in-flight data it would persist passes its budget: 'align' "
        "(takes the checkpoint aligned, persisting nothing) or 'abort' (declines the checkpoint).",
    )

    @field_validator(*CONFIG_RANGES, mode="after")
    @classmethod
    def _in_range(cls, v: int | None, info) -> int | None:
        lo, hi, low_message = CONFIG_RANGES[info.field_name]
        if v is not None and v < lo:
            raise ValueError(f"checkpoint.{info.field_name} {low_message}, got {v}")
        if v is not None and v > hi:
            raise ValueError(f"checkpoint.{info.field_name} is at most {hi}, got {v}")
        return v
