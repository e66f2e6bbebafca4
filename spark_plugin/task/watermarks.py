"""The watermark valve of a subtask's input channels (Flink's ``StatusWatermarkValve``): the subtask's watermark is
the minimum over its active input channels, an idle channel holds nothing back, and the watermark never goes back.

* A channel's watermark only rises; each one starts at ``MIN_WATERMARK``, so every channel must have sent one
  before the subtask's watermark moves.
* A channel that turns idle is left out of the minimum. When all channels are idle the subtask takes the highest
  of their watermarks and turns idle itself; when one turns active again so does the subtask.
* A channel that turns active again below the subtask's watermark is left out until it catches up, so the subtask's
  watermark never goes back. An ended channel is left out for good.

Its state is part of every checkpoint (``snapshot``) and comes back with a restore, per channel; see
``docs/recovery.md`` for how a rescaled restore starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spark_plugin.api.watermarks import MIN_WATERMARK
from spark_plugin.plan.topology import ChannelInfo


@dataclass
class ChannelWatermark:
    name: str
    peer_vertex: str | None
    watermark: int = MIN_WATERMARK
    idle: bool = False
    aligned: bool = True
    """Counted in the minimum (False after turning active again below the subtask's watermark, until it catches up)."""
    ended: bool = False


class WatermarkValve:
    """Combines the watermarks and status markers of a subtask's input channels."""

    def __init__(self, infos: list[ChannelInfo]) -> None:
        self.channels = [ChannelWatermark(info.name, info.peer_vertex) for info in infos]
        self.watermark = MIN_WATERMARK
        """The subtask's input watermark: the last minimum the valve let through."""
        self.idle = False
        """Every input channel is idle (or ended)."""

    # ------------------------------------------------------------------ input

    def on_watermark(self, channel: int, watermark: int) -> int | None:
        """A watermark arrived on ``channel``; returns the subtask's new watermark if it advanced."""
        ch = self.channels[channel]
        if ch.ended or watermark <= ch.watermark:
            return None
        ch.watermark = watermark
        if ch.idle:  # a sender sends ACTIVE before it sends again; count it as such
            return self.on_status(channel, False)[0]
        if not ch.aligned and watermark >= self.watermark:
            ch.aligned = True
        return self._advance(self._minimum())

    def on_status(self, channel: int, idle: bool) -> tuple[int | None, bool | None]:
        """``channel`` turned idle or active; returns the new watermark (if it advanced) and the subtask's new
        idleness (if it changed)."""
        ch = self.channels[channel]
        if ch.ended or ch.idle == idle:
            return None, None
        ch.idle = idle
        if idle:
            ch.aligned = False
            return self._recompute()
        ch.aligned = ch.watermark >= self.watermark
        if self.idle:
            self.idle = False
            return self._advance(self._minimum()), False
        return None, None

    def on_end(self, channel: int) -> tuple[int | None, bool | None]:
        """``channel`` ended: it holds nothing back any more."""
        ch = self.channels[channel]
        if ch.ended:
            return None, None
        ch.ended = True
        ch.aligned = False
        if all(c.ended for c in self.channels):
            return None, None  # the end of input: the subtask's event time ends (MAX_WATERMARK)
        return self._recompute()

    def _recompute(self) -> tuple[int | None, bool | None]:
        live = [c for c in self.channels if not c.ended]
        if live and all(c.idle for c in live):
            # every input is idle: take the highest watermark any of them reached (Flink does the same)
            advanced = self._advance(max(c.watermark for c in self.channels))
            if not self.idle:
                self.idle = True
                return advanced, True
            return advanced, None
        return self._advance(self._minimum()), None

    def _minimum(self) -> int | None:
        low = None
        for c in self.channels:
            if c.aligned and not c.idle and not c.ended and (low is None or c.watermark < low):
                low = c.watermark
        return low

    def _advance(self, watermark: int | None) -> int | None:
        if watermark is None or watermark <= self.watermark:
            return None
        self.watermark = watermark
        for c in self.channels:
            if not c.aligned and not c.idle and not c.ended and c.watermark >= watermark:
                c.aligned = True
        return watermark

    # ------------------------------------------------------------------ checkpoints

    def snapshot(self) -> dict[str, Any]:
        return {
            "watermark": self.watermark,
            "idle": self.idle,
            "channels": {c.name: (c.watermark, c.idle, c.aligned, c.ended, c.peer_vertex) for c in self.channels},
        }

    def restore_exact(self, state: dict[str, Any]) -> None:
        """The same channels as when the snapshot was taken: every channel as it was."""
        self.watermark = state["watermark"]
        self.idle = state["idle"]
        for c in self.channels:
            c.watermark, c.idle, c.aligned, c.ended, _ = state["channels"][c.name]

    def restore_rescaled(self, states: list[dict[str, Any]]) -> None:
        """The channels changed (a rescale): each channel starts at the lowest watermark any old channel from the
        same upstream vertex had reached (its in-flight data may now come from any of them), active; the subtask's
        watermark starts at the lowest of the old subtasks'."""
        lowest: dict[str | None, int] = {}
        for state in states:
            for wm, _idle, _aligned, ended, peer in state["channels"].values():
                if not ended:
                    lowest[peer] = min(wm, lowest.get(peer, wm))
        for c in self.channels:
            c.watermark = lowest.get(c.peer_vertex, MIN_WATERMARK)
            c.idle, c.aligned, c.ended = False, True, False
        if states:
            self.watermark = min(s["watermark"] for s in states)
