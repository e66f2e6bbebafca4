"""The codec benchmark on a tiny input: every codec gives the buffers back and reports a size and two rates (no
timing is asserted)."""

from __future__ import annotations

from benchmarks.channel_state_codecs import measure


def test_each_codec_round_trips_the_buffers_and_reports_its_ratio_and_rates():
    lines = measure(buffers=5, rows=50)
    assert [line.split(":")[0] for line in lines] == ["lz4", "zstd"]
    assert all("MB/s, inflate" in line and "x), compress" in line for line in lines)
