"""Buffer debloating (Flink's FLIP-183): a receiver sizes its senders' buffers to a target time of its throughput.

Under backpressure every buffer of a channel is full, so what is in flight (and what every unaligned checkpoint
persists and every recovery replays) is the number of buffers times their size, however slowly the receiver
consumes them. With debloating the receiver measures how many bytes per second its subtask takes from the input
gate (time spent idle, with no input at all, left out) every ``debloat_period_s``, and chooses the buffer size at
which the buffers in use hold ``debloat_target_s`` seconds of that throughput:

    size = throughput × target ÷ buffers in use

smoothed by an exponential moving average over ``debloat_samples`` samples (a step may at most double the size, so
it grows as fast as it shrinks), kept between ``debloat_min_buffer_size`` and the configured ``buffer_size``. A
size that differs from the one announced last by more than ``debloat_threshold_percent`` (or reaches either bound)
is announced to every sender of the gate (``wire.BUFFER_SIZE``); senders cut their buffers at it from their next
record on. The number of buffers and the credits do not change, only how much each one holds.
"""

from __future__ import annotations

from spark_plugin.network.config import NetworkConfig


class BufferDebloater:
    """One input gate's throughput measurement and buffer size (Flink's ``ThroughputCalculator`` and
    ``BufferDebloater``). Driven by the subtask loop: ``add_idle`` while it waited for input, ``recalculate`` every
    period; pure arithmetic on the numbers it is given, so it is exact to test."""

    def __init__(self, config: NetworkConfig, now: float) -> None:
        assert config.debloat_target_s is not None, "debloating is off in this NetworkConfig"
        self.target_s = config.debloat_target_s
        self.period_s = config.debloat_period_s
        self.min_size = config.debloat_min_buffer_size
        self.max_size = config.buffer_size
        self.threshold = config.debloat_threshold_percent / 100
        self.alpha = 2 / (config.debloat_samples + 1)
        self.size = float(self.max_size)
        """The smoothed size (bytes)."""
        self.announced = self.max_size
        """The size the senders were told last (they start at the configured size)."""
        self.throughput: float | None = None
        """Bytes per second of the last period, or None before the first one."""
        self._since = now
        self._bytes = 0
        self._idle = 0.0
        self.next_at = now + self.period_s

    def add_bytes(self, n: int) -> None:
        """The subtask took ``n`` bytes of buffers from the gate."""
        self._bytes += n

    def add_idle(self, seconds: float) -> None:
        """The subtask waited ``seconds`` with no input to process (not counted as time to process in)."""
        self._idle += seconds

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def recalculate(self, now: float, buffers_in_use: int) -> int | None:
        """Close the period ending ``now``: the new size to announce, or None when it stays as announced."""
        busy = (now - self._since) - self._idle
        elapsed = now - self._since
        n = self._bytes
        self._since, self._bytes, self._idle = now, 0, 0.0
        self.next_at = now + self.period_s
        if elapsed <= 0:
            return None
        # a period spent entirely idle says nothing about how fast the subtask can take input
        if busy <= 0:
            return None
        self.throughput = n / busy
        desired = self.throughput * self.target_s / max(1, buffers_in_use)
        desired = min(desired, 2 * self.size)
        self.size += self.alpha * (desired - self.size)
        self.size = max(float(self.min_size), min(self.size, float(self.max_size)))
        new = int(self.size)
        if self._skip(new):
            return None
        self.announced = new
        return new

    def _skip(self, new: int) -> bool:
        if new == self.announced:
            return True
        if new <= self.min_size or new >= self.max_size:
            return False
        return abs(new - self.announced) <= self.announced * self.threshold
