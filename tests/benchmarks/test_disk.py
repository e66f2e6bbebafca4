"""The disk benchmark's channel-state writer (``overtake bench disk``): several subtasks as processes of their own,
as Spark runs them, each writing its share through the runtime's writers. No timing is asserted."""

from __future__ import annotations

import pytest

from benchmarks.disk import channel_state_write, realistic_buffers
from benchmarks.flip76 import Settings

MIB = 1 << 20


def test_subtasks_in_processes_of_their_own_write_their_shares_and_leave_nothing_behind(tmp_path):
    buffers = realistic_buffers(Settings(), n=4)
    seconds, durable_ms = channel_state_write(tmp_path, 4 * MIB, 256 * 1024, buffers, writers=2)
    assert seconds > 0 and durable_ms > 0
    assert list((tmp_path / "job-1").iterdir()) == []  # every checkpoint's objects and directory removed


def test_a_subtask_process_that_fails_is_reported_not_waited_for(tmp_path):
    not_a_directory = tmp_path / "file"
    not_a_directory.write_bytes(b"x")
    with pytest.raises(RuntimeError, match="channel-state writer process failed"):
        channel_state_write(not_a_directory, 2 * MIB, 256 * 1024, realistic_buffers(Settings(), n=4), writers=2)


def test_the_ratio_reads_the_best_raw_repeat_so_a_slowed_repeat_does_not_flatter_it():
    from benchmarks.disk import DiskStats

    d = DiskStats("disk", 512 * MIB, MIB, 32 << 10, raw_mib_s=[316.0, 795.0, 540.0], channel_state_mib_s=[781.0])
    assert d.raw == 795.0
    assert d.ratio == 781.0 / 795.0


def test_a_process_that_ends_without_answering_is_reported_when_it_ends_not_after_the_timeout():
    from benchmarks import processes

    ctx = processes.context()
    procs, conns = processes.start(ctx, print, [("a process that prints and ends",)])
    try:
        # seen when its pipe ends; were this side's copy of the process's end still open, the wait would run out
        # instead (TimeoutError)
        with pytest.raises(RuntimeError, match="a test process exited before it answered"):
            processes.answer(conns[0], "test", timeout=60)
    finally:
        processes.stop(procs)
