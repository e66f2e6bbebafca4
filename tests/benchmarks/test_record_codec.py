"""The record-encoding benchmark on a tiny input: both encodings give each form of batch back and report bytes and
two times (no timing is asserted)."""

from __future__ import annotations

from benchmarks.record_codec import measure


def test_each_encoding_round_trips_both_forms_of_batch_and_reports_bytes_and_times():
    lines = measure(records=3, rows=20, rounds=1)
    assert [line.split(":")[0] for line in lines] == [
        "batch, pickle", "batch, arrow ipc", "keyed batch, pickle", "keyed batch, arrow ipc"]
    assert all(" bytes, encode " in line and " us, decode " in line for line in lines)
