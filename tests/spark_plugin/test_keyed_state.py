"""Key groups and keyed state: stable hashing, contiguous ranges, restore by key-group range."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib

import pytest

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


def test_a_str_key_with_a_lone_surrogate_has_a_key_group_and_valid_text_keeps_its_own():
    from_json = json.loads('"user-\\ud800"')  # JSON text may escape half of a surrogate pair
    assert 0 <= key_group(from_json, 128) < 128
    assert key_group(from_json, 128) == key_group(json.loads('"user-\\ud800"'), 128)
    assert stable_hash("ü日本") == zlib.crc32("ü日本".encode())


@pytest.mark.parametrize("key", [["user", 1], {"user": 1}, ("user", [1])])
def test_an_unhashable_key_is_refused_saying_what_to_key_by_instead(key):
    with pytest.raises(TypeError, match=f"a {type(key).__name__} cannot be a key: .* key by a tuple, a str or a number"):
        key_group(key, 128)


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


def _fresh(text: str) -> str:
    """An equal string that is another object than ``text`` (as one parsed from another record would be)."""
    return text.encode("utf-8").decode("utf-8")


def test_equal_keys_share_a_key_group_whether_or_not_their_parts_are_one_object():
    user = "user-17"
    other = _fresh(user)
    assert other == user and other is not user
    tag = ("eu", "west-1")
    same = [
        ((user, user), (user, other)),
        ((user, (user, 3)), (user, (other, 3))),
        ((tag, tag), (tag, ("eu", _fresh("west-1")))),
        ((b"kk-1", b"kk-1"[:]), (b"kk-1", bytes(bytearray(b"kk-1")))),
        ((b"k", b"k", user), (b"k", bytes(bytearray(b"k")), other)),  # one byte: usually one object, not here
    ]
    for shared, distinct in same:
        assert shared == distinct
        assert stable_hash(shared) == stable_hash(distinct), (shared, distinct)
    # a key whose parts are all distinct objects keeps the key group it always had
    assert stable_hash((user, other)) == stable_hash(("user-17", "user-18"[:6] + "7"))


def test_a_keyed_state_counts_equal_tuple_keys_as_one_key():
    state = KeyedState(128, (0, 127))
    user = "user-17"
    state.put((user, user), 1)
    assert state.get((user, _fresh(user))) == 1


def test_equal_frozenset_keys_share_a_key_group_whatever_order_their_items_came_in():
    words = [f"user-{i}" for i in range(30)]
    for i in range(len(words) - 2):
        a, b, c = words[i : i + 3]
        assert stable_hash(frozenset([a, b, c])) == stable_hash(frozenset([c, b, a]))
        assert stable_hash((frozenset([a, b]), c)) == stable_hash((frozenset([b, a]), c))
    shrunk = set(range(1000))
    shrunk -= set(range(995))  # the same items in a larger table, so in another iteration order
    assert stable_hash(frozenset(shrunk)) == stable_hash(frozenset(range(995, 1000)))


def test_frozenset_keys_hash_alike_in_processes_with_different_hash_salts():
    code = (
        "from contract.keygroups import key_group; "
        "print(key_group(frozenset(['alice', 'bob', 'carol', 'dave']), 128))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True, text=True
        ).stdout
        for seed in ("1", "2", "3", "4")
    }
    assert len(outs) == 1 and outs.pop().strip().isdigit()
