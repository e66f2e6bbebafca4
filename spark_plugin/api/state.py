"""Operator state: keyed state addressed by key group, and the value-state handle of process functions."""

from __future__ import annotations

from typing import Any

from contract.keygroups import KEY_HASH_VERSION, key_group

_SEE = "docs/recovery.md, \"Key groups and key hashing\""


class KeyGroupMismatch(ValueError):
    """A key whose key group this subtask does not own: a record routed, or state keyed, by another key hash."""


def _kind(key: Any) -> str:
    text = repr(key)
    return f"{text if len(text) <= 80 else text[:79] + '…'} ({type(key).__name__})"


def not_owned(key: Any, g: int, key_group_range: tuple[int, int]) -> KeyGroupMismatch:
    """The error of a record whose key is in key group ``g``, outside this subtask's ``key_group_range``."""
    start, end = key_group_range
    return KeyGroupMismatch(
        f"key {_kind(key)} is in key group {g}, which this subtask (key groups {start}..{end}) does not own: its "
        f"record was routed by another key hash, e.g. in flight in a checkpoint taken before key hash version "
        f"{KEY_HASH_VERSION} ({_SEE})"
    )


def rehashed(key: Any, old: int, now: int, key_hash: int, what_then: str) -> KeyGroupMismatch:
    """The error of a restore that cannot move ``key`` from key group ``old`` (of key hash ``key_hash``) to ``now``."""
    return KeyGroupMismatch(
        f"the checkpoint keyed its state by key hash version {key_hash}, which put key {_kind(key)} in key group "
        f"{old}; version {KEY_HASH_VERSION} puts it in key group {now}, {what_then} ({_SEE})"
    )


class KeyedState:
    """One keyed operator's state: ``{key group: {key: value}}`` for the key groups its subtask owns."""

    def __init__(self, max_parallelism: int, key_group_range: tuple[int, int]) -> None:
        self.max_parallelism = max_parallelism
        self.key_group_range = key_group_range
        self.groups: dict[int, dict[Any, Any]] = {}

    def _group(self, key: Any) -> dict[Any, Any]:
        return self.group(key_group(key, self.max_parallelism), key)

    def group(self, g: int, key: Any) -> dict[Any, Any]:
        """The state of key group ``g``, the key group of ``key``, which this subtask must own."""
        d = self.groups.get(g)
        if d is None:
            start, end = self.key_group_range
            if not start <= g <= end:
                raise not_owned(key, g, self.key_group_range)
            d = self.groups[g] = {}
        return d

    def get(self, key: Any, default: Any = None) -> Any:
        return self._group(key).get(key, default)

    def put(self, key: Any, value: Any) -> None:
        self._group(key)[key] = value

    def delete(self, key: Any) -> None:
        self._group(key).pop(key, None)

    def items(self):
        for d in self.groups.values():
            yield from d.items()

    def snapshot(self) -> dict[int, dict[Any, Any]]:
        """A copy of the non-empty key groups (values are copied by the pickling that follows)."""
        return {g: dict(d) for g, d in self.groups.items() if d}

    def restore(self, groups: dict[int, dict[Any, Any]], key_hash: int = KEY_HASH_VERSION, move: bool = True) -> None:
        """Load the key groups of a snapshot that fall into this subtask's range.

        A snapshot keyed by an older key hash (``key_hash``) is loaded key by key: a key the current hash puts in
        another key group moves there (with ``move``) when this subtask owns that group; otherwise the restore
        fails, naming the key (the subtask that owns it now is not sent this key group's state)."""
        start, end = self.key_group_range
        for g, d in groups.items():
            if not start <= g <= end:
                continue
            if key_hash == KEY_HASH_VERSION:
                self.groups.setdefault(g, {}).update(d)
            else:
                self._restore_rehashed(g, d, key_hash, move)

    def _restore_rehashed(self, g: int, entries: dict[Any, Any], key_hash: int, move: bool) -> None:
        start, end = self.key_group_range
        for key, value in entries.items():
            now = key_group(key, self.max_parallelism)
            if now != g and not (move and start <= now <= end):
                raise rehashed(key, g, now, key_hash, (
                    f"which this subtask (key groups {start}..{end}) does not own. Restore this checkpoint with the "
                    "operator at parallelism 1 (every key then moves within its subtask) and take a new one, or "
                    "start the job without it" if move else
                    "and a timed operator cannot move a key's timers: start the job without this checkpoint"
                ))
            into = self.groups.setdefault(now, {})
            if key in into:
                twin = next(k for k in into if k == key)
                raise KeyGroupMismatch(
                    f"the checkpoint holds two states for one key, {_kind(twin)} and {_kind(key)}: key hash version "
                    f"{key_hash} put these equal keys in two key groups. Which state is the key's cannot be told: "
                    f"start the job without this checkpoint ({_SEE})"
                )
            into[key] = value


class ValueState:
    """The value of the current key, handed to a keyed process function."""

    __slots__ = ("_state", "_key")

    def __init__(self, state: KeyedState) -> None:
        self._state = state
        self._key: Any = None

    def value(self, default: Any = None) -> Any:
        return self._state.get(self._key, default)

    def update(self, value: Any) -> None:
        self._state.put(self._key, value)

    def clear(self) -> None:
        self._state.delete(self._key)
