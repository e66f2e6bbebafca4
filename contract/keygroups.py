"""Key groups: a stable hash of keys into ``max_parallelism`` groups and the contiguous range each subtask owns.

The one definition of the split, shared by the coordinator (restore plans) and the runtime (routing, keyed state).
"""

from __future__ import annotations

import pickle
import zlib
from typing import Any


def stable_hash(key: Any) -> int:
    """A hash of ``key`` that is the same in every process (Python's ``hash`` of str is salted per process)."""
    if isinstance(key, bool):
        return int(key)
    if isinstance(key, int):
        return key & 0xFFFFFFFF
    if isinstance(key, str):
        return zlib.crc32(key.encode("utf-8"))
    if isinstance(key, bytes):
        return zlib.crc32(key)
    return zlib.crc32(pickle.dumps(key, protocol=4))


def _mix(h: int) -> int:
    # murmur3 finalizer: spreads sequential integer keys over the key groups
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h


def key_group(key: Any, max_parallelism: int) -> int:
    """The key group of ``key``."""
    return _mix(stable_hash(key)) % max_parallelism


def operator_index(group: int, max_parallelism: int, parallelism: int) -> int:
    """The subtask that owns key group ``group`` (Flink's computeOperatorIndexForKeyGroup)."""
    return group * parallelism // max_parallelism


def key_group_range(subtask: int, max_parallelism: int, parallelism: int) -> tuple[int, int]:
    """The inclusive key-group range ``(start, end)`` of ``subtask``."""
    start = (subtask * max_parallelism + parallelism - 1) // parallelism
    end = ((subtask + 1) * max_parallelism - 1) // parallelism
    return start, end
