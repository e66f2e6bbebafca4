"""The typed values the ack commit's steps hand each other (`app.domain.acks`): an ack waiting for its answer, one
checkpoint's acks of a batch with what was read of it under the locks, and each step's result."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from app.domain.ack_store import CheckpointFacts, Completing
from app.domain.written import Referenced
from app.errors import DomainError
from contract.models import AckResult, SubtaskAck

SubtaskKey = tuple[str, int]
"""(vertex, subtask index): a checkpoint holds one ack per subtask."""


@dataclass
class AckItem:
    """An ack in the committer's queue; `result` is its answer, set by the step that decides it."""

    job_id: int
    checkpoint_id: int
    ack: SubtaskAck
    digest: str
    token_attempt: int | None  # the attempt of the task token it came with (None: admin, or no auth)
    future: asyncio.Future = field(repr=False)
    missing: DomainError | None = None  # its written object is not in the store as it says (`written.check`)
    together: bool = False  # submitted with others (a relay's batch request): they were gathered already
    result: AckResult | DomainError | None = None

    @property
    def subtask(self) -> SubtaskKey:
        return (self.ack.vertex, self.ack.subtask_index)


@dataclass
class CheckpointBatch:
    """One checkpoint's acks of a batch (their tokens admitted), with what they are decided against: the
    checkpoint's facts read under the job and checkpoint row locks, the job's graph (vertex -> parallelism) and
    key groups (vertex -> max parallelism) of the current attempt, and the rows completing needs when they were
    read with the locks (`ack_store.lock_completing`: the batch was expected to complete the checkpoint)."""

    job_id: int
    cp_id: int
    items: list[AckItem]
    facts: CheckpointFacts
    graph: dict[str, int]
    key_groups: dict[str, int]
    preloaded: Completing | None = None


@dataclass
class Admitted:
    """The acks that passed admission: one per subtask to insert (`candidates`, in the batch's order) and a second
    ack of a subtask within the batch (`repeats`, answered once the first is recorded); the channel-state blobs of
    older checkpoints the acks reference; the batch's time."""

    candidates: dict[SubtaskKey, AckItem]
    repeats: list[AckItem]
    referenced: Referenced
    now: int


@dataclass
class Inserted:
    """The ack rows inserted (an ack whose subtask had acked before is not), in the batch's order, and whether
    channel-state references were recorded with them."""

    rows: dict[SubtaskKey, dict]
    references_added: bool = False


class Outcome(enum.Enum):
    """What a checkpoint's batch means, once inserted (`ack_counting.classify`)."""

    NOTHING_NEW = "no ack was inserted: every ack was refused or repeats one recorded; the checkpoint stands as it was"
    COUNTED = "acks were inserted and others are still missing: the checkpoint stays pending"
    COMPLETES = "the inserted acks are the last missing ones: the checkpoint completes in this transaction"


@dataclass(frozen=True)
class Counted:
    """The checkpoint after the batch: its acks and its status (COMPLETED if the batch completed it)."""

    num_acked: int
    status: str
