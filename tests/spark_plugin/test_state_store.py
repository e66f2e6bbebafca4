"""A subtask's side of the blob store without Spark: state written durably as one object under the checkpoint's
prefix, acked by handle; restored blobs read back from their locations and verified; the ack worker's choice between
writing straight into the store and uploading through the coordinator."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from contract.models import BlobLocation, WriteTarget, WrittenState
from spark_plugin.task.ack_worker import AckWorker, CheckpointUpload
from spark_plugin.task.state_store import BlobReader, CorruptBlobError, StateTargets, StateWriter


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def target(root: Path, prefix: str = "job-1/cp-000000000003/") -> WriteTarget:
    return WriteTarget(prefix=prefix, url=root.as_uri())


def test_state_is_written_as_one_object_under_the_checkpoints_prefix_and_described_by_its_handle(tmp_path):
    writer = StateWriter("count-1-a2.state")
    written = writer.write(target(tmp_path), b"operator", b"channel-bytes")
    path = tmp_path / "job-1" / "cp-000000000003" / "count-1-a2.state"
    assert path.read_bytes() == b"operatorchannel-bytes"
    assert written == WrittenState(
        key="job-1/cp-000000000003/count-1-a2.state", size=21, operator_size=8,
        operator_sha256=sha(b"operator"), channel_sha256=sha(b"channel-bytes"),
    )
    assert written.channel_size == 13
    assert [p.name for p in path.parent.iterdir()] == ["count-1-a2.state"]  # no temporary file left behind


def test_a_write_makes_its_file_and_every_directory_it_created_durable_and_no_more(tmp_path, monkeypatch):
    import spark_plugin.task.state_store as store

    synced: list[Path] = []
    real = store._fsync_dir
    monkeypatch.setattr(store, "_fsync_dir", lambda p: (synced.append(p), real(p)))
    StateWriter("a.state").write(target(tmp_path), b"op", b"ch")
    job, cp = tmp_path / "job-1", tmp_path / "job-1" / "cp-000000000003"
    # the file's entry in the new checkpoint directory, that directory's entry, the new job directory's entry
    assert synced == [cp, job, tmp_path]
    synced.clear()
    StateWriter("b.state").write(target(tmp_path), b"op", b"ch")
    assert synced == [cp]  # the directories exist: the subtask that created them made them durable before acking
    synced.clear()
    StateWriter("c.state").write(target(tmp_path, "job-1/cp-000000000004/"), b"op", b"ch")
    assert synced == [job / "cp-000000000004", job]


@pytest.mark.parametrize(("op", "ch"), [(b"op", None), (None, b"ch"), (None, None)])
def test_missing_parts_have_no_checksum_and_the_handle_stays_valid(tmp_path, op, ch):
    written = StateWriter("s.state").write(target(tmp_path), op, ch)
    assert (written.operator_sha256 is None) == (op is None)
    assert (written.channel_sha256 is None) == (ch is None)
    WrittenState.model_validate(written.model_dump())  # the coordinator's validation accepts it


def test_writing_again_replaces_the_object_whole(tmp_path):
    """A retried write (the ack was lost) leaves the newer bytes, never a mix."""
    w = StateWriter("s.state")
    w.write(target(tmp_path), b"a" * 1000, b"b" * 1000)
    w.write(target(tmp_path), b"c", b"d")
    assert (tmp_path / "job-1" / "cp-000000000003" / "s.state").read_bytes() == b"cd"


def test_a_large_state_is_hashed_beside_its_write_and_written_whole_through_short_writes(tmp_path, monkeypatch):
    """State of HASH_ASIDE_BYTES or more is hashed on the writer's thread while the subtask writes it (a smaller one
    on the subtask's own); the object holds the operator state, then the channel state, however short the file
    system's writes, and it is the only file the write creates (no temporary file renamed into place)."""
    import os
    import threading

    from spark_plugin.task import state_store

    hashed_on: list[str] = []
    digests = state_store._digests

    def recording(op: bytes, ch: bytes):
        hashed_on.append(threading.current_thread().name)
        return digests(op, ch)

    real_writev, real_open = os.writev, os.open
    opened: list[str] = []
    monkeypatch.setattr(state_store, "_digests", recording)
    monkeypatch.setattr(state_store.os, "writev", lambda fd, views: real_writev(fd, [bytes(views[0][:100_000])]))
    monkeypatch.setattr(state_store.os, "open", lambda p, *a, **k: (opened.append(str(p)), real_open(p, *a, **k))[1])
    op, ch = os.urandom(3000), os.urandom(state_store.HASH_ASIDE_BYTES + 12_345)
    before = set(threading.enumerate())
    w = StateWriter("big.state")
    written = w.write(target(tmp_path), op, ch)
    path = tmp_path / "job-1" / "cp-000000000003" / "big.state"
    assert path.read_bytes() == op + ch
    assert (written.size, written.operator_size) == (len(op) + len(ch), len(op))
    assert (written.operator_sha256, written.channel_sha256) == (sha(op), sha(ch))
    assert hashed_on[-1].startswith("overtake-state-hash")
    w.write(target(tmp_path), b"small-op", b"small-ch")
    assert path.read_bytes() == b"small-opsmall-ch"  # cut to the new size
    assert hashed_on[-1] == threading.current_thread().name
    files = [p for p in opened if not Path(p).is_dir()]
    assert files == [str(path), str(path)]
    assert sorted(p.name for p in path.parent.iterdir()) == ["big.state"]
    hashing = [t for t in set(threading.enumerate()) - before if t.name.startswith("overtake-state-hash")]
    assert hashing
    pool = w._hasher  # held here, so only close() can end its thread (not its collection)
    w.close()  # a Spark task closes its writer as it ends: nothing of the task outlives it in a reused worker
    for t in hashing:
        t.join(10.0)
        assert not t.is_alive()
    assert pool is not None


def test_writing_the_same_state_again_never_leaves_other_bytes_even_cut_short(tmp_path, monkeypatch):
    """A retried ack writes the same state again, and the first ack may have counted: the object is written over,
    not truncated first, so a write again that stops half way (a crash) leaves the object as it was."""
    import os

    from spark_plugin.task import state_store

    op, ch = os.urandom(1000), os.urandom(50_000)
    StateWriter("s.state").write(target(tmp_path), op, ch)
    path = tmp_path / "job-1" / "cp-000000000003" / "s.state"
    real_writev = os.writev

    def crash_half_way(fd, views):
        real_writev(fd, [bytes(views[0][:20_000])])
        raise OSError("the machine stopped")

    monkeypatch.setattr(state_store.os, "writev", crash_half_way)
    with pytest.raises(OSError):
        StateWriter("s.state").write(target(tmp_path), op, ch)
    assert path.read_bytes() == op + ch


def stored(tmp_path: Path, blobs: list[bytes]) -> tuple[Path, list[BlobLocation]]:
    path = tmp_path / "obj"
    path.write_bytes(b"".join(blobs))
    locs, offset = [], 0
    for i, b in enumerate(blobs):
        locs.append(BlobLocation(blob_id=f"b{i}", sha256=sha(b), size=len(b), url=path.as_uri(), offset=offset))
        offset += len(b)
    return path, locs


def test_restored_blobs_are_read_from_their_location_at_their_offset_and_verified(tmp_path):
    _, locs = stored(tmp_path, [b"first-blob", b"second"])
    fetched: list[str] = []
    reader = BlobReader(locs, lambda blob_id: fetched.append(blob_id) or b"")
    assert reader.blob("b1") == b"second"
    assert reader.blob("b0") == b"first-blob"
    assert reader.range("b0", 2, 4) == b"rst"
    assert reader.range("b0", None, None) == b"first-blob"
    assert fetched == []  # nothing went through the coordinator


def test_a_blob_whose_bytes_changed_is_corrupt_and_never_returned(tmp_path):
    path, locs = stored(tmp_path, [b"first-blob", b"second"])
    data = bytearray(path.read_bytes())
    data[12] ^= 0xFF  # one bit of the second blob
    path.write_bytes(bytes(data))
    reader = BlobReader(locs, lambda blob_id: b"")
    assert reader.blob("b0") == b"first-blob"
    with pytest.raises(CorruptBlobError, match="blob b1 is corrupt") as e:
        reader.blob("b1")
    assert e.value.blob_id == "b1"


def test_a_truncated_object_is_corrupt(tmp_path):
    path, locs = stored(tmp_path, [b"first-blob", b"second"])
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(CorruptBlobError, match="4 bytes"):
        BlobReader(locs, lambda blob_id: b"").blob("b1")


def test_a_blob_without_a_url_comes_through_the_coordinator_and_is_verified_too(tmp_path):
    loc = BlobLocation(blob_id="x", sha256=sha(b"via coordinator"), size=15)
    assert BlobReader([loc], lambda blob_id: b"via coordinator").blob("x") == b"via coordinator"
    with pytest.raises(CorruptBlobError):
        BlobReader([loc], lambda blob_id: b"via coordinatoR").blob("x")


class Reporter:
    def __init__(self) -> None:
        self.acks: list[tuple[int, dict]] = []
        self.with_state: list[tuple[int, dict, bytes | None, bytes | None]] = []

    def ack(self, checkpoint_id, ack):
        self.acks.append((checkpoint_id, ack))

    def ack_with_state(self, checkpoint_id, ack, operator_state, channel_state):
        self.with_state.append((checkpoint_id, ack, operator_state, channel_state))

    def decline(self, checkpoint_id, reason): ...

    def request_checkpoint(self): ...

    def report_running(self): ...


def upload(cp: int) -> CheckpointUpload:
    return CheckpointUpload(cp, b"op", b"ch", [], {"src": 1}, (0, 63), {"unaligned": True})


def test_the_ack_worker_writes_into_the_target_of_the_checkpoints_trigger_and_acks_the_handle(tmp_path):
    targets, reporter = StateTargets(), Reporter()
    worker = AckWorker(reporter, targets=targets, writer=StateWriter("v-0-a1.state"), target_wait=5)
    targets.put(3, target(tmp_path))
    worker.submit(upload(3))
    assert worker.close()
    assert reporter.with_state == []
    [(cp, ack)] = reporter.acks
    assert cp == 3 and ack["written"]["key"] == "job-1/cp-000000000003/v-0-a1.state"
    assert (ack["key_group_start"], ack["key_group_end"], ack["source_offsets"]) == (0, 63, {"src": 1})
    assert (tmp_path / "job-1" / "cp-000000000003" / "v-0-a1.state").read_bytes() == b"opch"


def test_a_trigger_without_target_sends_the_state_through_the_coordinator(tmp_path):
    targets, reporter = StateTargets(), Reporter()
    worker = AckWorker(reporter, targets=targets, writer=StateWriter("v-0-a1.state"), target_wait=5)
    targets.put(4, None)  # the coordinator takes state through itself
    worker.submit(upload(4))
    assert worker.close()
    assert reporter.acks == [] and [(c, o, s) for c, _, o, s in reporter.with_state] == [(4, b"op", b"ch")]


def test_a_checkpoint_whose_trigger_never_arrived_falls_back_to_the_coordinator_after_the_wait(tmp_path):
    targets, reporter = StateTargets(), Reporter()
    worker = AckWorker(reporter, targets=targets, writer=StateWriter("v-0-a1.state"), target_wait=0.05)
    worker.submit(upload(5))
    assert worker.close()
    assert [c for c, *_ in reporter.with_state] == [5] and reporter.acks == []
