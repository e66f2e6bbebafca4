"""Key groups and keyed state: stable hashing, contiguous ranges, restore by key-group range."""

from __future__ import annotations

import os
import subprocess
import sys

from contract.keygroups import key_group, key_group_range, operator_index, stable_hash
from spark_plugin.api.state import KeyedState


def test_key_group_ranges_cover_all_groups_exactly_once_and_match_operator_index():
    for p in (1, 2, 3, 7):
        seen = []
        for i in range(p):
            start, end = key_group_range(i, 128, p)
            seen.extend(range(start, end + 1))
            assert all(operator_index(g, 128, p) == i for g in range(start, end + 1))
        assert seen == list(range(128))


def test_key_groups_are_the_same_in_processes_with_different_hash_salts():
    code = "from contract.keygroups import key_group; print([key_group(k, 128) for k in ('a', ('b', 2), 7)])"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True, text=True
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1 and outs.pop().startswith("[")


def test_sequential_integer_keys_spread_over_the_key_groups():
    assert stable_hash(5) == 5
    assert len({key_group(i, 128) for i in range(1000)}) > 100


def test_restore_keeps_only_the_key_groups_of_the_new_range():
    old = KeyedState(128, (0, 127))
    for k in range(200):
        old.put(k, k * 10)
    snap = old.snapshot()
    left, right = KeyedState(128, key_group_range(0, 128, 2)), KeyedState(128, key_group_range(1, 128, 2))
    left.restore(snap)
    right.restore(snap)
    merged = dict(left.items()) | dict(right.items())
    assert merged == {k: k * 10 for k in range(200)}
    assert not set(dict(left.items())) & set(dict(right.items()))
