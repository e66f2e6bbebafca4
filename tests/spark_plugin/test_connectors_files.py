"""File connectors: sources resume at their offsets; the file sink commits exactly once across a restore."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from contract.events import JobStatusChanged
from spark_plugin import Pipeline
from spark_plugin.connectors import FileSink, JsonLinesSource, ParquetSource
from spark_plugin.network.config import NetworkConfig
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.fakes import InMemoryCoordinator
from tests.spark_plugin.test_restore_threads import plan_from_acks
from tests.spark_plugin.test_subtask_threads import wait_for


def write_jsonl(d: Path, files: int, per_file: int) -> list[dict]:
    d.mkdir(parents=True, exist_ok=True)
    records = []
    for f in range(files):
        rows = [{"id": f * per_file + i, "key": (f * per_file + i) % 7} for i in range(per_file)]
        (d / f"in-{f}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        records += rows
    return records


def drain(source, batch: int = 10) -> list:
    out = []
    while (got := source.poll(batch)) is not None:
        out += got
    return out


def test_json_lines_source_resumes_after_its_offsets(tmp_path):
    records = write_jsonl(tmp_path / "in", files=3, per_file=25)
    src = JsonLinesSource(str(tmp_path / "in"))
    src.open(0, 2)  # files 0 and 2
    first = src.poll(30)
    offsets = src.offsets()
    again = JsonLinesSource(str(tmp_path / "in"))
    again.open(0, 2)
    again.seek(offsets)
    assert first + drain(again) == [r for r in records if r["id"] < 25 or r["id"] >= 50]


def test_parquet_source_resumes_after_its_offsets(tmp_path):
    d = tmp_path / "pq"
    d.mkdir()
    for f in range(2):
        pq.write_table(pa.table({"id": list(range(f * 100, f * 100 + 100))}), d / f"p-{f}.parquet", row_group_size=30)
    src = ParquetSource(str(d), batch_rows=16)
    src.open(0, 1)
    first = src.poll(45)
    again = ParquetSource(str(d), batch_rows=16)
    again.open(0, 1)
    again.seek(src.offsets())
    assert [r["id"] for r in first + drain(again, 37)] == list(range(200))


def slow(key, record, state):
    time.sleep(0.0002)
    return [record]


def file_pipeline(src_dir: Path, out_dir: Path) -> Pipeline:
    p = Pipeline("files", parallelism=2)
    (
        p.source(JsonLinesSource(str(src_dir)), id="src")
        .key_by(lambda r: r["key"])
        .process(slow, id="slow")
        .sink(FileSink(str(out_dir)), id="out")
    )
    return p


def committed_records(out_dir: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(out_dir.glob("part-*.jsonl")) for line in f.read_text().splitlines()]


def test_file_sink_output_is_exactly_once_across_a_restore_and_complete_at_the_end(tmp_path):
    records = write_jsonl(tmp_path / "in", files=4, per_file=1500)
    out = tmp_path / "out"
    net = NetworkConfig(buffer_size=512)
    first_coord = InMemoryCoordinator(expected_subtasks=4)
    first = ThreadedRun(file_pipeline(tmp_path / "in", out), first_coord.reporter, first_coord.events, net).start()
    wait_for(lambda: first.subtask("slow", 0).records_in > 500, "records to flow")
    first_coord.trigger(1, "unaligned")
    wait_for(lambda: 1 in first_coord.completed, "checkpoint 1")
    first_coord.publish(JobStatusChanged(status="CANCELLED"))  # a failure after checkpoint 1
    first.join(60)
    assert 0 < len(committed_records(out)) < len(records)

    def fetch(blob_id, start, end):
        data = first_coord.blobs[blob_id]
        return data if start is None else data[start : end + 1]

    second_coord = InMemoryCoordinator(expected_subtasks=4)
    second_coord.next_id = 2  # checkpoint ids go on across attempts
    second = ThreadedRun(
        file_pipeline(tmp_path / "in", out), second_coord.reporter, second_coord.events, net,
        restore=plan_from_acks(first_coord.acks[1]), fetch=fetch, restore_checkpoint=1,
    ).start()
    second.join(120)  # the sources end with a final checkpoint, which commits the rest
    got = committed_records(out)
    assert sorted(r["id"] for r in got) == [r["id"] for r in records]
    assert not list((out / ".pending").iterdir()) and not list((out / ".inprogress").iterdir())
