"""The channel-state codecs alone (``python -m benchmarks.channel_state_codecs``): how much lz4 and zstd shrink the
batch benchmark's in-flight buffers and how fast they compress and inflate them, on one core.

The buffers are what the batches benchmark's window subtasks receive: one ``pyarrow.RecordBatch`` (Arrow IPC) of
``rows`` rows ``(key, ts, value)`` each (a 65,536-row batch split into 67 key groups is some 980 rows), compressed
and inflated with ``contract.channel_state.pack``/``unpack`` as the runtime's writer and readers do. Prints one
line per codec; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import time


def measure(buffers: int, rows: int) -> list[str]:
    import numpy as np
    import pyarrow as pa

    from contract.channel_state import CODECS, pack, unpack
    from spark_plugin.network.framing import encode_records

    bufs = []
    for k in range(buffers):
        i = np.arange(k * rows, (k + 1) * rows, dtype=np.int64)
        bufs.append(encode_records([pa.record_batch({"key": i % 100, "ts": i, "value": (i * 31) % 97})]))
    raw = sum(map(len, bufs))
    lines = []
    for codec in CODECS:
        t = time.perf_counter()
        packed = [pack(codec, b) for b in bufs]
        c = time.perf_counter() - t
        t = time.perf_counter()
        out = [unpack(codec, p) for p in packed]
        d = time.perf_counter() - t
        if out != bufs:
            raise AssertionError(f"{codec} did not give the buffers back")
        n = sum(map(len, packed))
        lines.append(f"{codec}: {raw / 1e6:.1f} MB -> {n / 1e6:.1f} MB ({raw / n:.1f}x), compress "
                     f"{raw / 1e6 / c:,.0f} MB/s, inflate {raw / 1e6 / d:,.0f} MB/s")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.channel_state_codecs", description=__doc__.split("\n\n")[0])
    p.add_argument("--buffers", type=int, default=2000)
    p.add_argument("--rows", type=int, default=980)
    a = p.parse_args(argv)
    print("\n".join(measure(a.buffers, a.rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
