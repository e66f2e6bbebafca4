"""Key groups and keyed state: stable hashing, contiguous ranges, restore by key-group range."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from decimal import Decimal
from fractions import Fraction

import pytest

from contract.keygroups import _mix, key_group, key_group_range, operator_index, stable_hash, stable_hash_v1
from spark_plugin.api.state import KeyedState, KeyGroupMismatch
from spark_plugin.api.timers import TimerService
from spark_plugin.network.framing import encode_records
from spark_plugin.network.recovered import RestoreMismatch, keep_key_groups


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


# Hashes computed by the key hash of version 1: keys of these kinds keep their key groups, so checkpoints holding
# them restore exactly as before.
UNCHANGED_HASHES = [
    ("user-17", 1880864953),
    ("", 0),
    ("ü日本", 11261446),
    (b"kk-1", 4162179338),
    (7, 7),
    (-3, 4294967293),
    (2**40, 0),
    (True, 1),
    (("a", "b"), 4108686138),
    (("b", 2), 4155832204),
    (("user", ("eu", "west-1")), 82723861),
    ((1, 2), 3317922163),
    (("a", True), 548575830),
    (None, 2033757887),
    (1.5, 3853519348),
    (-2.25, 3260288317),
    (float("inf"), 3905360198),
    (("a", 1.5), 757812712),
    (("a", True, 1.5), 1577312938),
    ((2, -0.5, "x"), 1534753185),
    (frozenset(["alice", "bob"]), 2090920296),
    ((frozenset(["x"]), "y"), 3155976507),
]


def key_id(value) -> str:
    """A test id that names the key the same way in every process: a set's repr follows its elements' hashes, which
    differ from one interpreter to the next (PYTHONHASHSEED), and the workers of a pytest-xdist run must collect the
    same ids."""
    if isinstance(value, frozenset):
        return "frozenset({" + ", ".join(sorted(key_id(v) for v in value)) + "})"
    if isinstance(value, tuple):
        return "(" + ", ".join(key_id(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


@pytest.mark.parametrize(("key", "pinned"), UNCHANGED_HASHES, ids=key_id)
def test_str_int_and_tuple_keys_keep_the_hash_of_version_1(key, pinned):
    assert stable_hash(key) == pinned
    assert stable_hash_v1(key) == pinned


def test_equal_numbers_of_every_type_share_a_key_group():
    import numpy as np
    import pyarrow as pa

    ones = [1, True, 1.0, np.int64(1), np.int8(1), np.float64(1.0), np.float32(1.0), np.bool_(True),
            Decimal("1.00"), Fraction(2, 2), 1 + 0j]
    assert all(k == 1 for k in ones)
    assert {key_group(k, 128) for k in ones} == {key_group(1, 128)}
    halves = [1.5, np.float64(1.5), np.float32(1.5), Decimal("1.50"), Fraction(3, 2)]
    assert all(k == 1.5 for k in halves)
    assert {stable_hash(k) for k in halves} == {stable_hash(1.5)}
    # a pyarrow scalar equals no Python value, but hashes as the one it holds
    assert stable_hash(pa.scalar(1)) == stable_hash(pa.scalar(1.0)) == 1
    assert stable_hash(pa.scalar(1.5)) == stable_hash(1.5)
    assert stable_hash(Decimal("0.1")) == stable_hash(Fraction(1, 10)) != stable_hash(0.1)  # 0.1 is no float


def test_zero_and_negative_zero_share_a_key_group():
    assert stable_hash(-0.0) == stable_hash(0.0) == stable_hash(0)


def test_equal_tuples_with_numbers_of_different_types_share_a_key_group():
    import numpy as np

    assert stable_hash((1, 1.0)) == stable_hash((1, 1)) == stable_hash((True, np.int64(1)))
    assert stable_hash(("a", (2.0, "b"))) == stable_hash(("a", (2, "b")))
    assert stable_hash(("a", np.float64(1.5))) == stable_hash(("a", 1.5))
    assert stable_hash(frozenset([1.0, "x"])) == stable_hash(frozenset([1, "x"]))
    assert stable_hash((1, 1.5)) != stable_hash((1, 2.5))


@pytest.mark.parametrize("key", [float("nan"), ("user", float("nan")), Decimal("NaN")], ids=repr)
def test_a_nan_key_is_refused_saying_what_to_key_by_instead(key):
    with pytest.raises(ValueError, match="cannot be a key: a NaN equals no key.*a key of their own"):
        key_group(key, 128)


def test_number_keys_hash_alike_in_processes_with_different_hash_salts():
    code = (
        "import numpy as np; from decimal import Decimal; from contract.keygroups import stable_hash; "
        "print([stable_hash(k) for k in (1.5, -2.25, np.float64(0.75), Decimal('0.1'), ('a', 1.0), 1e300)])"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True, text=True
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(outs) == 1
    assert outs.pop().strip() == str([stable_hash(k) for k in (1.5, -2.25, 0.75, Decimal("0.1"), ("a", 1), 10**300)])


def _old_snapshot(entries: dict | list[tuple]) -> dict[int, dict]:
    """Keyed state as version 1 of the key hash kept it: ``{key group: {key: value}}``."""
    groups: dict[int, dict] = {}
    for key, value in entries.items() if isinstance(entries, dict) else entries:
        groups.setdefault(_mix(stable_hash_v1(key)) % 128, {})[key] = value
    return groups


def test_a_restore_of_state_keyed_by_the_old_hash_moves_each_key_to_its_key_group():
    import numpy as np

    entries = {float(k): k * 10 for k in range(50)} | {np.int64(100 + k): k for k in range(20)} | {"user-1": 7}
    old = _old_snapshot(entries)
    assert any(key_group(k, 128) != g for g, d in old.items() for k in d), "no key changed its key group"
    state = KeyedState(128, (0, 127))
    state.restore(old, key_hash=1)
    assert all(key_group(k, 128) == g for g, d in state.groups.items() for k in d)
    assert [state.get(k) for k in range(50)] == [k * 10 for k in range(50)]  # found by the equal int
    assert [state.get(100 + k) for k in range(20)] == list(range(20))
    assert state.get("user-1") == 7


def test_a_restore_of_the_old_hash_fails_naming_a_key_whose_key_group_another_subtask_owns_now():
    entries = {float(k): k for k in range(50)}
    old = _old_snapshot(entries)
    left, right = KeyedState(128, key_group_range(0, 128, 2)), KeyedState(128, key_group_range(1, 128, 2))
    with pytest.raises(KeyGroupMismatch, match=r"key hash version 1, which put key \d+\.0 \(float\) in key group "
                                               r"\d+; version 2 puts it in key group \d+, which this subtask .* at "
                                               r"parallelism 1"):
        for state in (left, right):
            state.restore(old, key_hash=1)


def test_a_restore_of_the_old_hash_refuses_two_states_of_one_key():
    old = _old_snapshot([(1, "as int"), (1.0, "as float")])
    assert len(old) == 2  # the old hash kept the equal keys apart
    with pytest.raises(KeyGroupMismatch, match=r"two states for one key, (1 \(int\) and 1\.0 \(float\)|"
                                               r"1\.0 \(float\) and 1 \(int\))"):
        KeyedState(128, (0, 127)).restore(old, key_hash=1)


def test_state_of_the_current_hash_restores_by_key_group_without_looking_at_keys():
    state = KeyedState(128, (0, 127))
    state.restore({5: {"not-in-group-5": 1}})  # the snapshot is trusted: no key is hashed
    assert state.groups == {5: {"not-in-group-5": 1}}


def test_a_key_of_a_key_group_the_subtask_does_not_own_is_refused():
    left = KeyedState(128, key_group_range(0, 128, 2))
    theirs = next(k for k in range(100) if key_group(k, 128) > left.key_group_range[1])
    with pytest.raises(KeyGroupMismatch, match=f"key {theirs} \\(int\\) is in key group .* does not own"):
        left.put(theirs, 1)
    with pytest.raises(KeyGroupMismatch, match=f"key {theirs} \\(int\\) is in key group .* does not own"):
        TimerService(128, left.key_group_range).register_event_time(theirs, 100)  # windows' key groups too


def test_a_restore_of_the_old_hash_fails_naming_a_timer_whose_key_changed_its_key_group():
    moved = next(float(k) for k in range(50) if _mix(stable_hash_v1(float(k))) % 128 != key_group(k, 128))
    old = TimerService(128, (0, 127))
    old.register_event_time(moved, 100, kg=_mix(stable_hash_v1(moved)) % 128)
    old.register_event_time("user-1", 100)
    with pytest.raises(KeyGroupMismatch, match=f"put key {moved} \\(float\\) .* a timer cannot move"):
        TimerService(128, (0, 127)).restore(old.snapshot(), key_hash=1)
    kept = TimerService(128, (0, 127))
    kept.restore(TimerService(128, (0, 127)).snapshot(), key_hash=1)  # no timer to move: restores


def test_a_rescaled_restore_refuses_an_in_flight_record_routed_by_the_old_hash():
    """Persisted by the subtask of key groups 0..63 under version 1, the record of key ``moved`` belongs to key group
    64 or above now: the new subtasks sent that segment (those overlapping 0..63) would all drop it."""
    moved = next(float(k) for k in range(100) if _mix(stable_hash_v1(float(k))) % 128 < 64 <= key_group(k, 128))
    user = next(f"user-{i}" for i in range(100) if key_group(f"user-{i}", 128) < 64)
    buffers = [encode_records([(user, 1), (moved, 2)])]
    with pytest.raises(RestoreMismatch, match=f"key {moved} \\(float\\) is in key group \\d+, outside the key groups "
                                              "0..63 of the subtask that persisted it: it was routed by another key"):
        keep_key_groups(buffers, lambda r: r[0], 128, (0, 42), (0, 63))
    kept, dropped = keep_key_groups([encode_records([(user, 1)])], lambda r: r[0], 128, (0, 42), (0, 63))
    assert len(kept) + dropped == 1  # a record of the current hash is kept or left to its owner, as before
