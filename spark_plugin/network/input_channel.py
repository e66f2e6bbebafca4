"""One input channel's receiving side: its queue of buffers and barrier markers (``channel_items``), its credit
account, and its ``ChannelStatePersister``. The input gate (``spark_plugin.network.input``) owns the channels and
is the only one that acts on them."""

from __future__ import annotations

import socket
from collections import deque

from spark_plugin.network.channel_items import DATA, Barrier, HeldBarrier, PriorityBarrier, QueueItem
from spark_plugin.network.persisting import ChannelStatePersister, ChannelStateWriting
from spark_plugin.plan.topology import ChannelInfo


class InputChannel:
    """One channel's receiving side: its queue of buffers and barrier markers, its credit account, its persister."""

    def __init__(self, index: int, info: ChannelInfo, writer: ChannelStateWriting | None = None) -> None:
        self.index = index
        self.info = info
        self.items: deque[QueueItem] = deque()
        self.sock: socket.socket | None = None
        self.granted = 0
        self.floating = 0
        self.backlog = 0
        self.blocked = False
        self.ended = False
        self.persister = ChannelStatePersister(info, writer)
        self.recovery_ended = False
        self.received_buffers = 0
        self.received_bytes = 0
        self.error: BaseException | None = None

    def bytes_before(self, checkpoint_id: int) -> int:
        """The bytes queued ahead of ``checkpoint_id``'s barrier marker (all queued bytes when none is queued)."""
        n = 0
        for item in self.items:
            kind = type(item)
            if kind in DATA:
                n += len(item.data)
            elif (kind is PriorityBarrier or kind is Barrier) and item.barrier.checkpoint_id == checkpoint_id:
                return n
        return n

    def buffers_before(self, checkpoint_id: int) -> list[bytes]:
        """The queued buffers ahead of ``checkpoint_id``'s priority (or held) barrier ([] when no such barrier is
        queued)."""
        ahead: list[bytes] = []
        for item in self.items:
            kind = type(item)
            if kind in DATA:
                ahead.append(item.data)
            elif (kind is PriorityBarrier or kind is HeldBarrier) and item.barrier.checkpoint_id == checkpoint_id:
                return ahead
        return []
