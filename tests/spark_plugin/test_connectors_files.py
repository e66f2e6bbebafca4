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
    src.open(0, 1)
    first = src.poll(30) + src.poll(30)  # a batch of two files
    offsets = src.offsets()
    again = JsonLinesSource(str(tmp_path / "in"))
    again.open(0, 1)
    again.seek(offsets)
    got = first + drain(again)
    assert sorted(r["id"] for r in got) == [r["id"] for r in records]
    for f in range(3):
        assert [r["id"] for r in got if r["id"] // 25 == f] == list(range(f * 25, f * 25 + 25)), "out of order"


def test_the_files_of_a_json_lines_source_are_shared_by_its_subtasks(tmp_path):
    records = write_jsonl(tmp_path / "in", files=6, per_file=5)
    got = []
    for i in range(3):
        src = JsonLinesSource(str(tmp_path / "in"))
        src.open(i, 3)
        got += drain(src)
    assert sorted(r["id"] for r in got) == [r["id"] for r in records]


def test_offsets_of_the_file_sources_from_before_files_were_splits_still_restore(tmp_path):
    records = write_jsonl(tmp_path / "in", files=3, per_file=4)
    line = len(json.dumps(records[0]) + "\n")
    src = JsonLinesSource(str(tmp_path / "in"))
    src.open(0, 1)
    # old subtask 0 of 2 read file 0 to its end and one line of file 2; old subtask 1 had not started file 1
    src.restore_positions([{"files": {"0": -1, "2": line}}, {"file": 0, "position": 0}])
    assert sorted(r["id"] for r in drain(src)) == [*range(4, 8), *range(9, 12)]


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
    ids = [r["id"] for r in first + drain(again, 37)]
    assert sorted(ids) == list(range(200))
    assert [i for i in ids if i < 100] == list(range(100)) and [i for i in ids if i >= 100] == list(range(100, 200))


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


def test_a_json_lines_files_lag_is_the_bytes_left_and_a_parquet_files_the_rows_left(tmp_path):
    write_jsonl(tmp_path / "in", files=1, per_file=10)
    path = tmp_path / "in" / "in-0.jsonl"
    src = JsonLinesSource(str(tmp_path / "in"))
    src.open(0, 1)
    assert [s["lag"] for s in src.split_metrics(100)["splits"]] == [None]  # not opened yet
    src.poll(4)
    (split,) = src.split_metrics(100)["splits"]
    assert split["lag"] == path.stat().st_size - int(split["position"]) > 0

    pq.write_table(pa.table({"id": list(range(50))}), tmp_path / "rows.parquet")
    rows = ParquetSource(str(tmp_path / "rows.parquet"), batch_rows=16)
    rows.open(0, 1)
    rows.poll(20)
    (split,) = rows.split_metrics(100)["splits"]
    assert (split["position"], split["lag"]) == ("20", 30)
