"""Keys of different number types, every subtask a thread: equal keys are one key, and a checkpoint whose keyed
state and in-flight records were keyed by the old key hash restores with exact counts."""

from __future__ import annotations

import time
from collections import defaultdict
from decimal import Decimal

import numpy as np
import pytest

from contract import keygroups
from contract.events import JobStatusChanged
from spark_plugin import Pipeline
from spark_plugin.api.operators import KeyedOperator
from spark_plugin.api.state import KeyGroupMismatch
from spark_plugin.connectors import CollectSink, SequenceSource
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.fakes import InMemoryCoordinator, sample_until
from tests.spark_plugin.test_rescale_threads import rescale_plan
from tests.spark_plugin.test_restore_threads import SMALL, plan_from_acks
from tests.spark_plugin.test_subtask_threads import wait_for

KEYS = 12
TYPES = (int, float, np.int64, Decimal)


def mixed(record):
    """Key ``seq % KEYS``, as an int, a float, a numpy int or a Decimal by turns."""
    seq = record[1]
    return (TYPES[seq // KEYS % len(TYPES)](seq % KEYS), seq)


def as_float(record):
    return (float(record[1] % KEYS), record[1])


def count(key, record, state):
    time.sleep(0.0003)  # the keyed stage is slow: backpressure, so the checkpoint holds records in flight
    n = (state.value() or 0) + 1
    state.update(n)
    return [(key, n)]


def counting(total: int, keys=mixed, keyed: int = 2) -> Pipeline:
    p = Pipeline("key-types", parallelism=2)
    (
        p.source(SequenceSource(count=total), id="src")
        .map(keys, id="keys")
        .key_by(lambda r: r[0])
        .process(count, id="count", parallelism=keyed)
        .sink(CollectSink(), id="out")
    )
    return p


def last_counts(results) -> dict[int, int]:
    """The highest count each key reached, by the int the key equals."""
    last: dict[int, int] = defaultdict(int)
    for res in results:
        for key, n in res.outputs.get("out", {}).get("records", []):
            assert key == int(key)
            last[int(key)] = max(last[int(key)], n)
    return dict(last)


def per_key(total: int) -> dict[int, int]:
    return {k: len(range(k, total, KEYS)) for k in range(KEYS)}


def test_equal_keys_of_different_number_types_are_counted_as_one_key():
    total = 1200
    coord = InMemoryCoordinator()
    results = ThreadedRun(counting(total), coord.reporter, coord.events, SMALL).start().join(60)
    assert last_counts(results) == per_key(total)


def _version_1_snapshot(self, checkpoint_id):
    return {"keyed": self.state.snapshot()}  # what keyed operators wrote before key hash version 2


@pytest.mark.parametrize("keyed_after", [1, 2])
def test_a_checkpoint_keyed_by_the_old_hash_restores_with_exact_counts(monkeypatch, keyed_after):
    """The first run hashes keys as version 1 did (its float keys fall into other key groups than the equal ints)
    and is stopped after an unaligned checkpoint; the second, of the current hash, counts keys of every number type
    on from it. With the keyed stage at parallelism 1 every key moves within its subtask and the counts end exact;
    at parallelism 2 some key would have to move to the other subtask, and the restore fails naming it."""
    total = 6000

    def take():
        coord = InMemoryCoordinator()
        with monkeypatch.context() as old:
            old.setattr(keygroups, "stable_hash", keygroups.stable_hash_v1)
            old.setattr(KeyedOperator, "snapshot", _version_1_snapshot)
            first = ThreadedRun(counting(total, as_float), coord.reporter, coord.events, SMALL).start()
            wait_for(lambda: first.subtask("count", 0).records_in > 300, "records to flow")
            coord.trigger(1, "unaligned")
            wait_for(lambda: len(coord.acks.get(1, {})) == 4, "checkpoint 1")
            coord.publish(JobStatusChanged(status="CANCELLED"))
            first.join(60)
        return coord

    def why_not(coord):
        in_flight = [k for k, p in plan_from_acks(coord.acks[1]).items() if k[0] == "count" and p["input_channel_state"]]
        return None if in_flight else "no count subtask with input in flight"

    coord = sample_until(take, why_not, "unaligned checkpoint with the counts' input in flight")
    acks = coord.acks[1]
    plan = rescale_plan(acks, "count", keyed_after)

    def fetch(blob_id, start, end):
        data = coord.blobs[blob_id]
        return data if start is None else data[start : end + 1]

    second_coord = InMemoryCoordinator()

    def second_run():
        return ThreadedRun(counting(total, mixed, keyed_after), second_coord.reporter, second_coord.events, SMALL,
                           restore=plan, fetch=fetch, restore_checkpoint=1).start().join(120)

    if keyed_after == 2:
        with pytest.raises(KeyGroupMismatch, match=r"key hash version 1, which put key \d+\.0 \(float\) in key "
                                                   r"group \d+; version 2 puts it in key group \d+, which this "
                                                   r"subtask \(key groups \d+\.\.\d+\) does not own"):
            second_run()
        return
    assert last_counts(second_run()) == per_key(total)
