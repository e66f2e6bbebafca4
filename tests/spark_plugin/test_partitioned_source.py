"""The partitioned source contract: a user's source lists its splits and reads one; the runtime assigns splits to
subtasks, keeps their positions in checkpoints, moves whole splits when the source is rescaled, and picks up new
splits while running. The user's source below has no restore code at all."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

from contract.events import JobStatusChanged
from spark_plugin import Pipeline
from spark_plugin.connectors import CollectSink
from spark_plugin.connectors.base import PartitionedSource, Source, SplitReader
from spark_plugin.connectors.split_reading import split_owner
from spark_plugin.network.config import NetworkConfig
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.fakes import InMemoryCoordinator
from tests.spark_plugin.test_restore_threads import plan_from_acks
from tests.spark_plugin.test_subtask_threads import wait_for

SMALL = NetworkConfig(buffer_size=512)


class Orders(PartitionedSource):
    """A user's source: splits ``orders-0`` ... ``orders-{splits-1}`` of ``per_split`` records ``(key, q, n)``."""

    def __init__(self, splits: int = 5, per_split: int = 1200, discovery_interval: float | None = None) -> None:
        self.splits = splits
        self.per_split = per_split
        self.discovery_interval = discovery_interval

    def list_splits(self) -> list[str]:
        return [f"orders-{q}" for q in range(TOPIC.get("splits", self.splits))]

    def build_split_reader(self, split: str, position):
        return OrderReader(int(split.rsplit("-", 1)[1]), position or 0, self.per_split)


class OrderReader(SplitReader):
    def __init__(self, q: int, n: int, end: int | None) -> None:
        self.q, self.n, self.end = q, n, end
        self.paused = False

    def poll(self, max_records):
        if self.end is not None and self.n >= self.end:
            return None
        m = max_records if self.end is None else min(max_records, self.end - self.n)
        out = [(f"{self.q}/{n % 4}", self.q, n) for n in range(self.n, self.n + m)]
        self.n += m
        return out

    def position(self):
        return self.n

    def pause(self):
        self.paused = True

    def resume(self):
        self.paused = False


TOPIC: dict[str, int] = {}
"""The discovery test's topic: how many splits it has now (shared by the subtasks, threads of this process)."""


def slow_pass(key, record, state):
    time.sleep(0.0002)  # the keyed stage is the slow one: data is in flight at the checkpoint
    return [record]


def orders_pipeline(source_parallelism: int, source: PartitionedSource | None = None) -> Pipeline:
    p = Pipeline("orders", parallelism=2)
    (
        p.source(source or Orders(), id="src", parallelism=source_parallelism)
        .key_by(lambda r: r[0])
        .process(slow_pass, id="slow", parallelism=2)
        .sink(CollectSink(), id="out")
    )
    return p


def source_rescaled(acks: dict, new_parallelism: int) -> dict:
    """The coordinator's restore plan when only the source vertex changes parallelism: each new source subtask
    gets every old one's offsets and the state and output of the old subtasks that map to it."""
    old = plan_from_acks(acks)
    plan = {k: v for k, v in old.items() if k[0] != "src"}
    sources = {i: v for (vertex, i), v in old.items() if vertex == "src"}
    positions = [{"from_subtask": j, "offsets": v["source_offsets"]} for j, v in sorted(sources.items())]
    for i in range(new_parallelism):
        mapped = [v for j, v in sorted(sources.items()) if j % new_parallelism == i]
        plan[("src", i)] = {
            "operator_state": [ref for v in mapped for ref in v["operator_state"]],
            "source_offsets": None,
            "source_positions": positions,
            "output_channel_state": [seg for v in mapped for seg in v["output_channel_state"]],
            "input_channel_state": [],
        }
    return plan


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 2)])
def test_a_users_partitioned_source_rescales_without_restore_code_exactly_once_in_key_order(old, new):
    coord = InMemoryCoordinator()
    first = ThreadedRun(orders_pipeline(old), coord.reporter, coord.events, SMALL).start()
    wait_for(lambda: first.subtask("slow", 0).records_in > 500, "records to flow")
    coord.trigger(1, "unaligned")
    wait_for(lambda: len(coord.acks.get(1, {})) == old + 2, "checkpoint 1")
    coord.publish(JobStatusChanged(status="CANCELLED"))
    first.join(60)
    offsets = [a["source_offsets"] for (v, _), a in coord.acks[1].items() if v == "src"]
    assert any(n for o in offsets for n in o["split_positions"].values()), "no split had been read at the checkpoint"

    def fetch(blob_id, start, end):
        data = coord.blobs[blob_id]
        return data if start is None else data[start : end + 1]

    second_coord = InMemoryCoordinator()
    second = ThreadedRun(
        orders_pipeline(new), second_coord.reporter, second_coord.events, SMALL,
        restore=source_rescaled(coord.acks[1], new), fetch=fetch, restore_checkpoint=1,
    )
    owned = [second.subtask("src", i).chain.source.partitions() for i in range(new)]
    assert sorted(s for splits in owned for s in splits) == [f"orders-{q}" for q in range(5)]  # each once
    results = second.start().join(120)

    per_subtask = [res.outputs["out"]["records"] for res in results if "out" in res.outputs]
    got = sorted((q, n) for records in per_subtask for _, q, n in records)
    want = [(q, n) for q in range(5) for n in range(1200)]
    assert got == want, f"{len(got) - len(set(got))} duplicates, {len(set(want) - set(got))} missing"
    for records in per_subtask:
        by_key = defaultdict(list)
        for key, _, n in records:
            by_key[key].append(n)
        assert all(ns == sorted(ns) for ns in by_key.values()), "a key's records out of order"


def test_a_split_added_while_running_is_read():
    TOPIC["splits"] = 2
    try:
        source = Orders(per_split=None, discovery_interval=0.05)  # unbounded splits, listed again every 50 ms
        coord = InMemoryCoordinator()
        run = ThreadedRun(orders_pipeline(2, source), coord.reporter, coord.events, SMALL).start()
        sinks = [run.subtask("slow", i).chain.operators[-1].sink for i in range(2)]

        def splits_seen() -> set[int]:
            return {q for s in sinks for _, q, _ in list(s.records)}

        wait_for(lambda: splits_seen() == {0, 1}, "the first two splits")
        TOPIC["splits"] = 3  # a partition added to the topic
        wait_for(lambda: 2 in splits_seen(), "the new split to be read")
        coord.publish(JobStatusChanged(status="CANCELLED"))
        run.join(60)
        first_of_key: dict[str, int] = {}
        for s in sinks:
            for key, q, n in s.records:
                if q == 2:
                    first_of_key.setdefault(key, n)
        # read from its beginning: each key of the new split starts at its first record (n % 4 == key's residue)
        assert first_of_key and all(n == int(key.split("/")[1]) for key, n in first_of_key.items())
    finally:
        TOPIC.clear()


def test_a_split_belongs_to_one_subtask_by_its_id_alone():
    splits = [f"orders-{q}" for q in range(8)]
    for p in (1, 2, 3, 8):
        owners = [split_owner(s, p) for s in splits]
        assert all(0 <= o < p for o in owners)
        counts = [owners.count(i) for i in range(p)]
        assert max(counts) - min(counts) <= 1, "numbered splits are spread round robin"
    assert [split_owner(str(q), 4) for q in range(6)] == [0, 1, 2, 3, 0, 1]
    assert split_owner("a.jsonl", 3) == split_owner("a.jsonl", 3)  # stable: a CRC-32, not Python's salted hash


def test_under_backpressure_the_runtime_pauses_every_split_reader_and_resumes_them():
    src = Orders(splits=3, per_split=10)
    src.open(0, 1)
    src.poll(4)  # reads orders-0
    src.pause()
    src.poll(4)  # (the runtime does not poll while paused; a reader made now starts paused)
    assert all(r.paused for r in src.reading.readers.values())
    src.resume()
    assert not any(r.paused for r in src.reading.readers.values())


class Countdown(Source):
    """A user's older ``Source``: subtask ``i`` of ``p`` emits ``(i, p, n)`` for ``n`` below ``per_subtask``; no
    ``restore_positions``."""

    def __init__(self, per_subtask: int = 1500) -> None:
        self.per_subtask = per_subtask
        self.n = 0

    def poll(self, max_records):
        if self.n >= self.per_subtask:
            return None
        m = min(max_records, self.per_subtask - self.n)
        out = [(f"{self.subtask_index}/{n % 4}", self.subtask_index, n) for n in range(self.n, self.n + m)]
        self.n += m
        return out

    def offsets(self):
        return {"n": self.n}

    def seek(self, offsets):
        self.n = offsets["n"]


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 2)])
def test_an_older_source_without_restore_positions_rescales_as_one_split_per_first_run_subtask(old, new):
    coord = InMemoryCoordinator()
    first = ThreadedRun(orders_pipeline(old, Countdown()), coord.reporter, coord.events, SMALL).start()
    wait_for(lambda: first.subtask("slow", 0).records_in > 500, "records to flow")
    coord.trigger(1, "unaligned")
    wait_for(lambda: len(coord.acks.get(1, {})) == old + 2, "checkpoint 1")
    coord.publish(JobStatusChanged(status="CANCELLED"))
    first.join(60)

    def fetch(blob_id, start, end):
        data = coord.blobs[blob_id]
        return data if start is None else data[start : end + 1]

    second = ThreadedRun(
        orders_pipeline(new, Countdown()), InMemoryCoordinator().reporter, InMemoryCoordinator().events, SMALL,
        restore=source_rescaled(coord.acks[1], new), fetch=fetch, restore_checkpoint=1,
    )
    results = second.start().join(120)  # before, the restore failed: "cannot resume at another parallelism"
    per_subtask = [res.outputs["out"]["records"] for res in results if "out" in res.outputs]
    got = sorted((i, n) for records in per_subtask for _, i, n in records)
    assert got == [(i, n) for i in range(old) for n in range(1500)]
    for records in per_subtask:
        by_key = defaultdict(list)
        for key, _, n in records:
            by_key[key].append(n)
        assert all(ns == sorted(ns) for ns in by_key.values()), "a key's records out of order"


def test_a_split_that_ended_is_not_read_again_after_a_restore_at_another_parallelism():
    old = []
    for i in range(2):
        src = Orders(splits=4, per_split=5)
        src.open(i, 2)
        while src.poll(3):  # read every split of this subtask to its end
            pass
        old.append(src.offsets())
    assert sorted(s for o in old for s in o["finished_splits"]) == [f"orders-{q}" for q in range(4)]
    new = Orders(splits=5, per_split=5)  # a fifth split was added meanwhile
    new.open(0, 1)
    new.restore_positions(old)
    got = []
    while (batch := new.poll(10)) is not None:
        got += batch
    assert got == [("4/0", 4, 0), ("4/1", 4, 1), ("4/2", 4, 2), ("4/3", 4, 3), ("4/0", 4, 4)]  # only the new one
