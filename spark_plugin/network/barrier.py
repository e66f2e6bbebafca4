"""The checkpoint barrier: the marker of checkpoint *n* that travels in the channels with the data, and its bytes."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

from contract.events import CheckpointTriggered
from contract.models import BarrierPolicy


@dataclass(frozen=True)
class CheckpointBarrier:
    """The barrier of checkpoint ``checkpoint_id``, carrying the policy the coordinator chose for it.

    ``unaligned`` is True when the barrier travels as a priority event (it overtakes queued buffers). A barrier
    with an alignment timeout (``aligned_then_unaligned``) starts aligned and may turn unaligned past ``deadline``;
    one without (aligned checkpoints, savepoints, a source's final checkpoint) never does.

    ``inflight_budget`` travels with it so every subtask knows the most in-flight bytes it may persist for the
    checkpoint; one that would persist more takes it aligned (``over_inflight_budget`` "align") or declines it
    ("abort").

    ``max_concurrent`` is the job's limit on pending checkpoints: above 1, a subtask keeps an older unaligned
    checkpoint going when a newer unaligned barrier arrives (up to that many at once) instead of declining it. It is
    left off the wire at 1, so barriers of one-at-a-time jobs encode as before.
    """

    checkpoint_id: int
    trigger_timestamp: int
    policy: BarrierPolicy = BarrierPolicy.aligned
    alignment_timeout: int | None = None
    is_savepoint: bool = False
    unaligned: bool = False
    inflight_budget: int | None = None
    over_inflight_budget: str = "align"
    max_concurrent: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.policy, BarrierPolicy):
            try:
                object.__setattr__(self, "policy", BarrierPolicy(self.policy))
            except ValueError:
                known = ", ".join(p.value for p in BarrierPolicy)
                raise ValueError(f"unknown barrier policy {self.policy!r}; use one of {known}") from None
        if self.policy == BarrierPolicy.adaptive:
            raise ValueError(
                f"checkpoint {self.checkpoint_id}: a barrier carries the policy the coordinator chose for it "
                "(aligned, unaligned, unaligned_last_barrier or aligned_then_unaligned), never adaptive"
            )

    @classmethod
    def of(cls, trigger: CheckpointTriggered) -> CheckpointBarrier:
        """The barrier a source sends for the coordinator's trigger."""
        return cls(
            checkpoint_id=trigger.checkpoint_id,
            trigger_timestamp=trigger.trigger_timestamp,
            policy=trigger.policy,
            alignment_timeout=trigger.alignment_timeout,
            is_savepoint=trigger.is_savepoint,
            inflight_budget=trigger.inflight_budget,
            over_inflight_budget=trigger.over_inflight_budget,
            max_concurrent=trigger.max_concurrent,
        )

    @property
    def deadline(self) -> int | None:
        """Epoch ms at which an alignment still going on turns unaligned (None: never)."""
        if self.alignment_timeout is None or self.is_savepoint:
            return None
        return self.trigger_timestamp + self.alignment_timeout

    def as_unaligned(self) -> CheckpointBarrier:
        """The same barrier as a priority event."""
        return replace(self, unaligned=True)

    def as_aligned(self) -> CheckpointBarrier:
        """The same barrier sent in band, behind the queued buffers."""
        return replace(self, unaligned=False)

    def over_budget(self, inflight_bytes: int) -> bool:
        """Whether persisting ``inflight_bytes`` would pass the checkpoint's in-flight budget."""
        return self.inflight_budget is not None and inflight_bytes > self.inflight_budget

    def as_aligned_final(self) -> CheckpointBarrier:
        """The same checkpoint sent aligned behind every record, never switching (a source's final checkpoint)."""
        return replace(self, policy=BarrierPolicy.aligned, alignment_timeout=None, unaligned=False)

    def encode(self) -> bytes:
        d = asdict(self)
        d["policy"] = self.policy.value
        if self.max_concurrent == 1:
            del d["max_concurrent"]
        return json.dumps(d).encode()

    @classmethod
    def decode(cls, payload: bytes) -> CheckpointBarrier:
        return cls(**json.loads(payload))
