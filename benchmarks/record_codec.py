"""Batches on the wire (``python -m benchmarks.record_codec``): a batch edge's record encoded as an Arrow IPC stream
(``contract.record_codec``, what the runtime sends and persists) against the pickle it used to be, on one core.

Each batch has ``rows`` rows ``(key, ts, value)`` (the batches benchmark's window subtasks receive some 980-row
sub-batches), plain and keyed (``SubtaskBatch``, as out of ``key_by``). Prints one line per form and encoding: the
bytes per record and the microseconds to encode and to decode one, the median of ``rounds`` timed rounds of
``records`` each; asserts nothing about time, only that every encoding gives the batch back.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import time


def measure(records: int, rows: int, rounds: int = 5) -> list[str]:
    import numpy as np
    import pyarrow as pa

    from contract.record_codec import SubtaskBatch, decode, encode

    i = np.arange(rows, dtype=np.int64)
    batch = pa.record_batch({"key": i % 100, "ts": i, "value": (i * 31) % 97})
    forms = {"batch": batch, "keyed batch": SubtaskBatch(0, "key", batch)}
    encodings = {
        "pickle": (lambda r: pickle.dumps(r, protocol=5), pickle.loads),
        "arrow ipc": (encode, decode),
    }
    lines = []
    for form, record in forms.items():
        for name, (enc, dec) in encodings.items():
            data = enc(record)
            back = dec(data)
            if not (back if form == "batch" else back.batch).equals(batch):
                raise AssertionError(f"{name} did not give the {form} back")
            if name == "arrow ipc" and data[:1] != b"\xff":
                raise AssertionError(f"the {form} was not Arrow-encoded")
            e, d = [], []
            for _ in range(rounds):
                t = time.perf_counter()
                for _ in range(records):
                    enc(record)
                e.append((time.perf_counter() - t) / records * 1e6)
                t = time.perf_counter()
                for _ in range(records):
                    dec(data)
                d.append((time.perf_counter() - t) / records * 1e6)
            lines.append(f"{form}, {name}: {len(data):,} bytes, encode {statistics.median(e):.1f} us, "
                         f"decode {statistics.median(d):.1f} us")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.record_codec", description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=2000)
    p.add_argument("--rows", type=int, default=980)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args(argv)
    print("\n".join(measure(a.records, a.rows, a.rounds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
