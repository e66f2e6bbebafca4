"""Key groups: a stable hash of keys into ``max_parallelism`` groups and the contiguous range each subtask owns.

The one definition of the split, shared by the coordinator (restore plans) and the runtime (routing, keyed state).
"""

from __future__ import annotations

import io
import numbers
import pickle
import zlib
from typing import Any

#: The key hash that :func:`stable_hash` computes. Version 1 (:func:`stable_hash_v1`) hashed a number that is not an
#: int (``1.0``, ``numpy.int64(1)``, ``Decimal(1)``) by its pickle, so it fell into another key group than the int it
#: equals; keyed state written by version 2 says so (docs/recovery.md, "Key groups and key hashing").
KEY_HASH_VERSION = 2

_MASK = 0xFFFFFFFF


def stable_hash(key: Any) -> int:
    """A hash of ``key`` that is the same in every process and every version (Python's ``hash`` of str is salted
    per process), and the same for equal keys.

    Equal numbers hash alike: a bool, an int, and any other number equal to an int (``1.0``, ``-0.0``,
    ``numpy.int64(1)``, ``Decimal("1.00")``, ``Fraction(2, 2)``, ``1 + 0j``) hash as that int; any other number as
    the float it equals (``numpy.float32(1.5)`` as ``1.5``), or, if no float equals it, by its numerator and
    denominator. A NaN is refused: it equals nothing, itself included, so its records could never share state. A
    numpy or pyarrow scalar hashes as its Python value. A tuple or frozenset that holds such a number (one that is
    not an int, a bool or a non-integral float), at any depth, hashes with every number in it written so (its bools
    as ints); any other tuple or frozenset keeps the hash it always had (so does a float key that is not integral),
    so the key groups of those keys in old checkpoints stay theirs.

    Other keys hash by their pickle (see :func:`stable_hash_v1`)."""
    if isinstance(key, bool):
        return int(key)
    if isinstance(key, int):
        return key & _MASK
    if isinstance(key, (str, bytes)):
        return stable_hash_v1(key)
    return stable_hash_v1(_canonical(key))


def stable_hash_v1(key: Any) -> int:
    """The key hash of version 1, which :func:`stable_hash` computes after writing the numbers of a key alike.

    Keys that are not numbers, str or bytes hash by their pickle, which refers back to an object met before
    instead of writing it again: a tuple key whose parts are one object, ``(user, user)``, would pickle otherwise
    than the equal key built from two equal strings, and the two would fall into different key groups (two keys in
    the state, on two subtasks).
    A tuple that holds an object twice is therefore pickled as if each of its strings, bytes and tuples were an
    object of its own, which is what an equal key without repeated objects pickles to anyway; an empty or
    one-character str or bytes, which Python usually keeps one object of, is referred back to by its value. A
    frozenset pickles its items in its iteration order, which depends on the order they were added in and on the
    process's str hashes: its items are written in one order, sorted by their own pickles. A str hashes by its
    UTF-8 bytes, a lone surrogate included."""
    if isinstance(key, bool):
        return int(key)
    if isinstance(key, int):
        return key & _MASK
    if isinstance(key, str):
        # a lone surrogate (JSON's "\ud800" decodes to one) is written as UTF-8 would write it; valid text is unchanged
        return zlib.crc32(key.encode("utf-8", "surrogatepass"))
    if isinstance(key, bytes):
        return zlib.crc32(key)
    try:
        hash(key)
    except TypeError:
        raise TypeError(
            f"a {type(key).__name__} cannot be a key: {_brief(key)} is unhashable (mutable), so equal keys could not "
            "share their state; key by a tuple, a str or a number instead (e.g. tuple(...))"
        ) from None
    if isinstance(key, frozenset) or (isinstance(key, tuple) and _pickle_varies(key)):
        return zlib.crc32(_pickle_unshared(key))
    return zlib.crc32(pickle.dumps(key, protocol=4))


def _canonical(key: Any) -> Any:
    """``key`` with its numbers written as :func:`stable_hash` hashes them (``key`` itself when nothing changes)."""
    kind = type(key)
    if kind is tuple or kind is frozenset:
        return _rewritten(key) if _holds_number(key) else key
    if _is_scalar(key):
        return _number(key)
    return key


def _is_scalar(part: Any) -> bool:
    """A number that is not an int or bool, or a numpy or pyarrow scalar: what :func:`_number` writes anew."""
    kind = type(part)
    if kind is float:
        return True
    if kind is str or kind is bytes or kind is int or kind is bool or kind is tuple or part is None:
        return False
    # a numpy or pyarrow scalar; not an array (unhashable: refused as a key)
    foreign = kind.__module__ in ("numpy", "pyarrow.lib") and kind.__hash__ is not None
    return foreign or isinstance(part, numbers.Number)


_PLAIN = frozenset({str, bytes, int, bool, type(None)})


def _holds_number(key: tuple | frozenset) -> bool:
    """Whether ``key`` or a tuple or frozenset in it holds a part that :func:`_number` writes otherwise: a number
    that is not an int, bool or non-integral float (a non-integral float is written as it is)."""
    stack = [key]
    while stack:
        for part in stack.pop():
            kind = type(part)
            if kind in _PLAIN:
                continue
            if kind is tuple or kind is frozenset:
                stack.append(part)
            elif kind is float:
                if part.is_integer() or part != part:
                    return True
            elif _is_scalar(part):
                return True
    return False


def _rewritten(key: tuple | frozenset) -> Any:
    parts = (_rewritten_part(p) for p in key)
    return tuple(parts) if type(key) is tuple else frozenset(parts)


def _rewritten_part(part: Any) -> Any:
    if type(part) is tuple or type(part) is frozenset:
        return _rewritten(part)
    if isinstance(part, int):
        return int(part)  # a bool (or an int subclass) as the int it equals
    return _number(part) if _is_scalar(part) else part


def _number(x: Any) -> Any:
    """The int equal to ``x``, else the float, else ``("ratio", numerator, denominator)``; a non-number scalar as
    its Python value."""
    module = type(x).__module__
    if module == "pyarrow.lib" and hasattr(x, "as_py"):
        return _python(x.as_py())
    if module == "numpy" and hasattr(x, "item"):
        value = x.item()  # numpy's bool, int, float, complex, str as Python's (a long double stays one)
        if type(value) is not type(x):
            return _python(value)
    if isinstance(x, int):
        return int(x)
    if isinstance(x, numbers.Complex) and not isinstance(x, numbers.Real):
        return _number(x.real) if x.imag == 0 else complex(x)
    try:
        n, d = x.as_integer_ratio()
    except OverflowError:
        return float(x)  # an infinity
    except ValueError:
        raise ValueError(
            f"{_brief(x)} (a {type(x).__name__}) cannot be a key: a NaN equals no key, itself included, so its "
            "records could never share their state; give missing or invalid values a key of their own (e.g. None)"
        ) from None
    except AttributeError:
        return x  # a number without a ratio: by its pickle
    if d == 1:
        return n
    try:
        f = n / d  # correctly rounded
    except OverflowError:
        f = None  # beyond every float
    if f is not None and f.as_integer_ratio() == (n, d):
        return x if type(x) is float else f
    return ("ratio", n, d)


def _python(value: Any) -> Any:
    """A numpy or pyarrow scalar's Python value, written as :func:`stable_hash` hashes it."""
    return int(value) if isinstance(value, int) else _canonical(value)


def _brief(key: Any) -> str:
    text = repr(key)
    return text if len(text) <= 100 else text[:99] + "…"


def _by_value(part: Any) -> bool:
    """An empty or one-character str or bytes: values CPython usually keeps a single object of."""
    kind = type(part)
    return (kind is str or kind is bytes) and len(part) < 2


def _pickle_varies(key: tuple) -> bool:
    """Whether ``key`` or a tuple nested in it holds an object twice, a :func:`_by_value` value twice, or a
    frozenset: whether its pickle may differ from an equal key's."""
    seen: set[Any] = set()
    stack = [key]
    while stack:
        for part in stack.pop():
            kind = type(part)
            if kind is str or kind is bytes:
                mark = part if len(part) < 2 else id(part)
            elif isinstance(part, (int, float, type(None))):
                continue  # written in place every time (bool is an int), never referred back to
            elif isinstance(part, tuple):
                if not part:
                    continue  # the empty tuple too
                mark = id(part)
                stack.append(part)
            elif isinstance(part, frozenset):
                return True
            else:
                mark = id(part)
            if mark in seen:
                return True
            seen.add(mark)
    return False


class _UnsharedPickler(pickle._Pickler):  # the Python pickler: its memo can be told what to refer back to
    """Writes every str, bytes, tuple and frozenset anew where it occurs again, as if it were another, equal object,
    except the :func:`_by_value` ones, referred back to by value, and a frozenset's items sorted by their pickles;
    everything else (classes) as ``pickle.dumps`` does."""

    dispatch = dict(pickle._Pickler.dispatch)

    def _save_frozenset(self, obj: frozenset) -> None:
        self.write(pickle.MARK)
        for item in sorted(obj, key=lambda item: _pickle_unshared((item,))):
            self.save(item)
        self.write(pickle.FROZENSET)
        self.memoize(obj)

    dispatch[frozenset] = _save_frozenset

    def save(self, obj: Any, save_persistent_id: bool = True) -> None:
        if _by_value(obj):
            met = self.memo.get((type(obj), obj))  # type: ignore[call-overload] - values are keys here too
            if met is not None:
                self.framer.commit_frame()
                self.write(self.get(met[0]))
                return
        super().save(obj, save_persistent_id)

    def memoize(self, obj: Any) -> None:
        if self.fast or not isinstance(obj, (str, bytes, tuple, frozenset)):
            super().memoize(obj)
            return
        index = len(self.memo)
        self.write(self.put(index))
        mark = (type(obj), obj) if _by_value(obj) else ("unshared", index)
        self.memo[mark] = index, obj  # type: ignore[index] - never looked up by an id


def _pickle_unshared(key: tuple | frozenset) -> bytes:
    out = io.BytesIO()
    _UnsharedPickler(out, protocol=4).dump(key)
    return out.getvalue()


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
