"""`overtake checkpoints export-arrow`: a checkpoint's in-flight Arrow batches as Arrow IPC files, read through the
restore plan and ranged blob downloads (a scripted coordinator answers)."""

from __future__ import annotations

import httpx
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from typer.testing import CliRunner

from cli import main as cli
from client.sync import OvertakeClient
from spark_plugin.network.framing import encode_records
from spark_plugin.plan.topology import ChannelInfo
from spark_plugin.task.channel_state import ChannelStateWriter
from tests.client._fakes import Script

runner = CliRunner()
BLOB = "e" * 32


@pytest.fixture
def coordinator(monkeypatch):
    script = Script()

    def client(url=None, token=None, **_):
        return OvertakeClient("http://fake:1", token=token, retries=0, transport=httpx.MockTransport(script))

    monkeypatch.setattr("cli.app.OvertakeClient", client)
    return script


def _ranged(data: bytes):
    def answer(request: httpx.Request) -> httpx.Response:
        first, last = request.headers["Range"].removeprefix("bytes=").split("-")
        return httpx.Response(206, content=data[int(first) : int(last) + 1],
                              headers={"Content-Type": "application/octet-stream"})

    return answer


def test_export_arrow_writes_a_compressed_segments_batches_as_a_file_pyarrow_opens(coordinator, tmp_path):
    info = ChannelInfo("in:src[1]->agg[0]", "input", "src", 1, "hash")
    batch = pa.record_batch({"key": [7, 8], "value": [1.5, 2.5]})
    w = ChannelStateWriter("lz4")
    w.start(4)
    w.add_input_data(4, info, encode_records([batch]))
    w.finish_input(4)
    w.finish_output(4)
    result = w.take(4)
    (seg,) = result.segments
    plan = {"job_id": 9, "checkpoint_id": 4, "subtasks": [{
        "vertex": "agg", "subtask_index": 0,
        "input_channel_state": [{**seg.model_dump(mode="json"), "blob_id": BLOB, "from_subtask": 0}],
    }]}
    coordinator.answers += [httpx.Response(200, json=plan), _ranged(result.data)]
    out = tmp_path / "arrow"
    run = runner.invoke(cli.app, ["checkpoints", "export-arrow", "9", "4", "--out", str(out)])
    assert run.exit_code == 0, run.output
    assert "1 of 1 segments of checkpoint 4 held Arrow batches" in run.stdout
    assert coordinator.requests[0].url.params["checkpoint_id"] == "4"
    assert coordinator.requests[1].headers["Range"] == f"bytes={seg.offset}-{seg.offset + seg.length - 1}"
    (path,) = out.iterdir()
    table = ipc.open_file(pa.OSFile(str(path))).read_all()
    assert table.to_pydict() == {"key": [7, 8], "value": [1.5, 2.5]}
    assert table.schema.metadata[b"overtake.peer_subtask"] == b"1"
