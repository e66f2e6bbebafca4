"""Incremental channel state in the runtime: a buffer the latest completed checkpoint persisted and that is still in
flight is referenced where it lies, not written again; restoring reads every object once and replays the same bytes
as a checkpoint that wrote everything."""

from __future__ import annotations

from collections import Counter

from contract.events import JobStatusChanged
from spark_plugin.network.config import NetworkConfig
from spark_plugin.network.framing import encode_records
from spark_plugin.plan.topology import ChannelInfo
from spark_plugin.task.channel_state import ChannelStateReader, ChannelStateResult, ChannelStateWriter
from spark_plugin.task.state_store import BlobReader
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.fakes import StoreCoordinator
from tests.spark_plugin.test_subtask_threads import backpressured, wait_for

IN = ChannelInfo("in:src[0]->agg[0]", "input", "src", 0, "hash")
OUT = ChannelInfo("out:agg[0]->sink[0]", "output", "sink", 0, "forward")
SMALL = NetworkConfig(buffer_size=512)


def _take(w: ChannelStateWriter, cid: int, inputs: list[bytes], outputs: list[bytes]) -> ChannelStateResult:
    w.start(cid)
    for b in inputs:
        w.add_input_data(cid, IN, b)
    for b in outputs:
        w.add_output_data(cid, OUT, b, 1)
    w.finish_input(cid)
    w.finish_output(cid)
    return w.take(cid)


def _segment_bytes(result: ChannelStateResult, objects: dict[str, bytes], key: str) -> dict[str, bytes]:
    """Each segment's bytes, its parts resolved against the channel state of the objects written so far."""
    objects = {**objects, key: result.data}
    out = {}
    for seg in result.segments:
        runs = [(p.key or key, p.offset, p.length) for p in seg.parts] if seg.parts else [(key, seg.offset, seg.length)]
        out[seg.channel] = b"".join(objects[k][o : o + n] for k, o, n in runs)
    return out


def test_buffers_still_in_flight_after_a_completed_checkpoint_are_referenced_not_written_again():
    w = ChannelStateWriter()
    queued = [encode_records([i] * 20) for i in range(4)]
    first = _take(w, 1, queued, [queued[0]])
    w.written(1, "job-7/cp-000000000001/agg-0-a1.state", first)
    w.completed(1)
    # under sustained backpressure the same buffers are still queued, behind them one that is new
    new = encode_records(["new"] * 20)
    second = _take(w, 2, [*queued[2:], new], [queued[0]])
    assert second.referenced_bytes > 0
    (inp,) = [s for s in second.segments if s.direction == "input"]
    assert [(p.key, p.length) for p in inp.parts] == [
        ("job-7/cp-000000000001/agg-0-a1.state", 2 * (4 + len(queued[2]))),
        (None, 4 + len(new)),
    ]
    assert len(second.data) == 4 + len(new)  # only the new buffer is written
    objects = {"job-7/cp-000000000001/agg-0-a1.state": first.data}
    incremental = _segment_bytes(second, objects, "job-7/cp-000000000002/agg-0-a1.state")
    whole = second.whole()
    assert not whole.incremental and whole.persisted_bytes == second.persisted_bytes
    assert incremental == {s.channel: whole.data[s.offset : s.offset + s.length] for s in whole.segments}


def test_references_point_where_the_bytes_lie_across_several_checkpoints():
    w = ChannelStateWriter()
    stuck = encode_records(["stuck"] * 20)
    objects: dict[str, bytes] = {}
    for cid in (1, 2, 3):
        result = _take(w, cid, [stuck, encode_records([cid] * 20)], [])
        key = f"job-7/cp-{cid:012d}/agg-0-a1.state"
        resolved = _segment_bytes(result, objects, key)
        assert list(ChannelStateReader(resolved[IN.name]).buffers())[0] == stuck
        objects[key] = result.data
        w.written(cid, key, result)
        w.completed(cid)
        if cid > 1:  # the stuck buffer still lies in the first checkpoint's object
            (seg,) = result.segments
            assert seg.parts[0].key == "job-7/cp-000000000001/agg-0-a1.state"


def test_nothing_is_referenced_before_its_checkpoint_completed_or_after_one_that_wrote_nothing_referable():
    w = ChannelStateWriter()
    queued = [encode_records([i] * 20) for i in range(3)]
    first = _take(w, 1, queued, [])
    w.written(1, "job-7/cp-000000000001/a.state", first)
    assert not _take(w, 2, queued, []).incremental  # 1 has not completed
    w.completed(1)
    assert _take(w, 3, queued, []).incremental
    w.completed(3)  # completed, but nothing of it was written where it may be referenced (a savepoint)
    assert w.base_checkpoint == 3 and not _take(w, 4, queued, []).incremental


class CountingReader(BlobReader):
    """Counts how often each blob is read from the store (a read that is not served from the cache)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reads: Counter[str] = Counter()

    def blob(self, blob_id: str) -> bytes:
        if blob_id not in self._cache:
            self.reads[blob_id] += 1
        return super().blob(blob_id)


def test_a_backpressured_run_references_earlier_buffers_and_restores_exactly_once_reading_each_object_once(
    tmp_path,
):
    count = 8000
    coord = StoreCoordinator(tmp_path, expected_subtasks=4)
    first = ThreadedRun(
        backpressured(count), coord.reporter, coord.events, SMALL, state_writer_for=coord.state_writer
    ).start()
    wait_for(lambda: first.subtask("slow", 0).records_in > 600, "records to flow")
    referencing = None
    for cid in range(1, 8):  # under sustained backpressure, the second checkpoint on already references
        coord.trigger(cid, "unaligned")
        wait_for(lambda cid=cid: cid in coord.completed, f"checkpoint {cid}")
        parts = [p for a in coord.acks[cid].values() for s in a["channel_segments"] for p in s.get("parts") or []]
        if any(p.get("key") for p in parts):
            referencing = cid
            break
    coord.publish(JobStatusChanged(status="CANCELLED"))  # stop mid-stream, as a failure would
    first.join(60)
    assert referencing is not None, "no checkpoint referenced an earlier one's buffers"
    assert coord.refused == []
    referenced = {
        p["key"] for a in coord.acks[referencing].values() for s in a["channel_segments"] for p in s.get("parts") or []
        if p.get("key")
    }
    assert all(f"/cp-{referencing:012d}/" not in k for k in referenced)

    plan, locations = coord.restore_plan(referencing)
    shared = CountingReader(locations, through_coordinator=None)  # one restore: every subtask reads through it
    second_coord = StoreCoordinator(tmp_path / "second")
    second = ThreadedRun(
        backpressured(count), second_coord.reporter, second_coord.events, SMALL,
        restore=plan, fetch=shared.range, restore_checkpoint=referencing,
    ).start()
    results = second.join(120)
    assert shared.reads and max(shared.reads.values()) == 1
    assert any(blob_id.split("#")[0] in referenced for blob_id in shared.reads)
    records = [r for res in results for out in res.outputs.values() if "records" in out for r in out["records"]]
    seqs = sorted(r[1] for r in records)
    assert seqs == list(range(count)), (
        f"{len(seqs) - len(set(seqs))} duplicates, {len(set(range(count)) - set(seqs))} missing"
    )
    for res in results:
        if res.vertex != "slow":
            continue
        by_stream: dict[tuple, list[int]] = {}
        for key, seq in res.outputs["out"]["records"]:
            by_stream.setdefault((key, seq % 2), []).append(seq)
        assert all(v == sorted(v) for v in by_stream.values()), "records of a key were reordered"


class _RefusingReporter:
    """Refuses every ack whose channel state references an earlier object (as the coordinator does once the
    referenced checkpoint is no longer kept)."""

    def __init__(self) -> None:
        self.acks: list[dict] = []
        self.refused = 0

    def ack(self, checkpoint_id, ack):
        from client.errors import InvalidRequest

        if any(p.get("key") for s in ack["channel_segments"] for p in s.get("parts") or []):
            self.refused += 1
            raise InvalidRequest(422, "invalid", "object is no longer kept; write those buffers again")
        self.acks.append(ack)

    def ack_with_state(self, checkpoint_id, ack, operator_state, channel_state):
        self.acks.append({**ack, "uploaded": channel_state})


def test_refused_references_and_uploads_through_the_coordinator_write_every_buffer_again(tmp_path):
    from contract.models import WriteTarget
    from spark_plugin.task.ack_worker import AckWorker, CheckpointUpload
    from spark_plugin.task.checkpoints import _whole
    from spark_plugin.task.state_store import StateTargets, StateWriter

    w = ChannelStateWriter()
    queued = [encode_records([i] * 20) for i in range(3)]
    first = _take(w, 1, queued, [])
    w.written(1, "job-7/cp-000000000001/agg-0-a1.state", first)
    w.completed(1)
    second = _take(w, 2, queued, [])
    assert second.incremental and second.data == b""
    whole = second.whole()

    def upload(cid):
        return CheckpointUpload(
            checkpoint_id=cid, operator_state=b"op", channel_state=second.data or None,
            channel_segments=second.segments, source_offsets=None, key_group_range=None, metrics={},
            whole=lambda: _whole(second.whole()),
        )

    reporter = _RefusingReporter()
    targets = StateTargets()
    targets.put(2, WriteTarget(prefix="job-7/cp-000000000002/", url=tmp_path.as_uri() + "/", incremental=True))
    targets.put(3, None)  # this one goes through the coordinator
    worker = AckWorker(reporter, targets=targets, writer=StateWriter("agg-0-a1.state"))
    worker.submit(upload(2))
    worker.submit(upload(3))
    assert worker.close(30)
    assert reporter.refused == 1 and worker.errors == []
    written, uploaded = reporter.acks
    assert written["channel_segments"] == uploaded["channel_segments"] == [
        s.model_dump(mode="json") for s in whole.segments
    ]
    assert (tmp_path / "job-7/cp-000000000002/agg-0-a1.state").read_bytes() == b"op" + whole.data
    assert uploaded["uploaded"] == whole.data
