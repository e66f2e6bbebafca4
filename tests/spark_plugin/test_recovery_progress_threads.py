"""Recovery you can watch: a restored subtask reports, with its live metrics, what it restored, how much of it it
replayed, and when its replay finished; a fresh subtask reports no recovery."""

from __future__ import annotations

import threading

from contract.events import JobStatusChanged
from contract.models import SubtaskMetrics
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.fakes import InMemoryCoordinator
from tests.spark_plugin.test_restore_threads import SMALL, plan_from_acks
from tests.spark_plugin.test_subtask_threads import backpressured, wait_for


class Samples:
    """Every live-metrics sample each subtask sent, validated as the coordinator would."""

    def __init__(self) -> None:
        self.by_subtask: dict[tuple[str, int], list[SubtaskMetrics]] = {}
        self.lock = threading.Lock()

    def reporter_for(self, coord: InMemoryCoordinator):
        def reporter(spec):
            r = coord.reporter(spec)

            def report(metrics, timestamp, key=(spec.vertex, spec.subtask_index)):
                with self.lock:
                    self.by_subtask.setdefault(key, []).append(SubtaskMetrics.model_validate(metrics))

            r.report_metrics = report
            return r

        return reporter


def test_a_restored_subtask_reports_its_restored_bytes_its_replay_rising_to_them_and_when_it_finished():
    count = 6000
    coord = InMemoryCoordinator()
    fresh = Samples()
    first = ThreadedRun(backpressured(count), fresh.reporter_for(coord), coord.events, SMALL).start()
    wait_for(lambda: first.subtask("slow", 0).records_in > 600, "records to flow")
    coord.trigger(1, "unaligned")
    wait_for(lambda: len(coord.acks.get(1, {})) == 4, "checkpoint 1")
    coord.publish(JobStatusChanged(status="CANCELLED"))
    first.join(60)
    assert all(s.recovery is None for samples in fresh.by_subtask.values() for s in samples)

    def fetch(blob_id, start, end):
        data = coord.blobs[blob_id]
        return data if start is None else data[start : end + 1]

    second_coord = InMemoryCoordinator()
    restored = Samples()
    second = ThreadedRun(
        backpressured(count), restored.reporter_for(second_coord), second_coord.events, SMALL,
        restore=plan_from_acks(coord.acks[1]), fetch=fetch, restore_checkpoint=1,
    ).start()
    second.join(120)

    assert set(restored.by_subtask) == {(s.spec.vertex, s.spec.subtask_index) for s in second.subtasks}
    with_state = rose = 0
    for key, samples in restored.by_subtask.items():
        recoveries = [s.recovery for s in samples]
        assert all(r is not None and r.restored_checkpoint_id == 1 for r in recoveries), key
        replayed = [r.replayed_bytes for r in recoveries]
        assert replayed == sorted(replayed), f"{key}: replayed bytes went back: {replayed}"
        assert all(0 <= b <= recoveries[0].restored_bytes for b in replayed), key
        last = recoveries[-1]
        assert last.replayed_bytes == last.restored_bytes, key
        assert last.replay_finished_at is not None, f"{key} never reported the end of its replay"
        assert last.started_at <= last.loop_started_at <= last.replay_finished_at, key
        assert last.restore_ms is not None and last.restore_ms >= 0
        if last.restored_bytes > 0:
            with_state += 1
            assert last.restored_buffers > 0, key
            rose += replayed[0] < last.restored_bytes
    assert with_state > 0, "the checkpoint persisted in-flight data, so some subtask restored bytes"
    assert rose > 0, "a restored subtask reports as its loop starts, before it replayed all it restored"
