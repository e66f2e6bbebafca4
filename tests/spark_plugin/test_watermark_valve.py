"""The watermark valve: a subtask's watermark is the minimum over its active input channels, never goes back, and
comes back from a checkpoint per channel (exactly, or at the lowest old watermark after a rescale)."""

from __future__ import annotations

from spark_plugin.api.watermarks import MIN_WATERMARK
from spark_plugin.plan.topology import ChannelInfo
from spark_plugin.task.watermarks import WatermarkValve


def valve(n: int = 3, peer: str = "up") -> WatermarkValve:
    return WatermarkValve([ChannelInfo(f"in:{peer}[{i}]->me[0]", "input", peer, i, "hash") for i in range(n)])


def test_the_watermark_is_the_minimum_over_the_channels_once_each_sent_one():
    v = valve()
    assert v.on_watermark(0, 100) is None
    assert v.on_watermark(1, 50) is None
    assert v.watermark == MIN_WATERMARK  # channel 2 has sent nothing yet
    assert v.on_watermark(2, 70) == 50
    assert v.on_watermark(1, 90) == 70
    assert v.on_watermark(2, 200) == 90


def test_the_watermark_never_goes_back():
    v = valve(2)
    v.on_watermark(0, 100)
    v.on_watermark(1, 100)
    assert v.on_watermark(0, 40) is None  # a lower watermark on a channel is ignored
    assert v.channels[0].watermark == 100 and v.watermark == 100


def test_an_idle_channel_holds_nothing_back_and_all_idle_takes_the_highest():
    v = valve(3)
    v.on_watermark(0, 100)
    v.on_watermark(1, 300)
    assert v.on_status(2, idle=True) == (100, None)  # channel 2 never sent a watermark and is idle
    assert v.on_status(0, idle=True) == (300, None)
    assert v.on_status(1, idle=True) == (None, True)  # every channel idle: the subtask is idle at the highest
    assert v.idle and v.watermark == 300


def test_a_channel_back_from_idle_below_the_watermark_waits_until_it_caught_up():
    v = valve(2)
    v.on_watermark(0, 100)
    v.on_status(1, idle=True)
    v.on_watermark(0, 500)
    assert v.watermark == 500
    assert v.on_status(1, idle=False) == (None, None)
    assert not v.channels[1].aligned  # at MIN, far below 500: left out of the minimum
    assert v.on_watermark(0, 800) == 800
    assert v.on_watermark(1, 600) is None and not v.channels[1].aligned
    assert v.on_watermark(1, 900) is None and v.channels[1].aligned  # caught up: counted again
    assert v.on_watermark(0, 1000) == 900


def test_a_subtask_idle_on_all_inputs_turns_active_with_the_first_active_channel():
    v = valve(2)
    v.on_status(0, True)
    assert v.on_status(1, True)[1] is True
    assert v.on_status(0, False) == (None, False)
    assert not v.idle


def test_an_ended_channel_holds_nothing_back():
    v = valve(3)
    v.on_watermark(0, 100)
    v.on_watermark(1, 200)
    assert v.on_end(2) == (100, None)
    assert v.on_end(0) == (200, None)
    assert v.on_watermark(0, 900) is None  # nothing counts from an ended channel
    assert v.on_end(1) == (None, None)  # the last one: the end of input, which the subtask handles


def test_a_restore_with_the_same_channels_brings_every_channel_back_as_it_was():
    v = valve(3)
    v.on_watermark(0, 100)
    v.on_watermark(1, 300)
    v.on_status(2, True)
    state = v.snapshot()
    w = valve(3)
    w.restore_exact(state)
    assert w.snapshot() == state
    assert w.on_watermark(0, 400) == 300


def test_a_rescaled_restore_starts_each_channel_at_the_lowest_old_watermark_of_its_upstream_vertex():
    a, b = valve(2), valve(2)
    a.on_watermark(0, 100), a.on_watermark(1, 150)
    b.on_watermark(0, 120), b.on_watermark(1, 90)
    other = valve(1, peer="other")
    other.on_watermark(0, 5000)
    w = WatermarkValve([
        ChannelInfo("in:up[0]->me[2]", "input", "up", 0, "hash"),
        ChannelInfo("in:other[0]->me[2]", "input", "other", 0, "hash"),
        ChannelInfo("in:new[0]->me[2]", "input", "new", 0, "hash"),
    ])
    w.restore_rescaled([a.snapshot(), b.snapshot(), other.snapshot()])
    assert [c.watermark for c in w.channels] == [90, 5000, MIN_WATERMARK]
    assert w.watermark == 90  # the lowest old subtask's
    assert w.on_watermark(2, 10) is None  # channel "new" holds everything back until it sends more
    assert w.on_watermark(2, 95) is None and w.watermark == 90  # channel "up" is still at 90
    assert w.on_watermark(0, 99) == 95
