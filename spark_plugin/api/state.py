"""Operator state: keyed state addressed by key group, and the value-state handle of process functions."""

from __future__ import annotations

from typing import Any

from contract.keygroups import key_group


class KeyedState:
    """One keyed operator's state: ``{key group: {key: value}}`` for the key groups its subtask owns."""

    def __init__(self, max_parallelism: int, key_group_range: tuple[int, int]) -> None:
        self.max_parallelism = max_parallelism
        self.key_group_range = key_group_range
        self.groups: dict[int, dict[Any, Any]] = {}

    def _group(self, key: Any) -> dict[Any, Any]:
        g = key_group(key, self.max_parallelism)
        d = self.groups.get(g)
        if d is None:
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

    def restore(self, groups: dict[int, dict[Any, Any]]) -> None:
        """Load the key groups of a snapshot that fall into this subtask's range."""
        start, end = self.key_group_range
        for g, d in groups.items():
            if start <= g <= end:
                self.groups.setdefault(g, {}).update(d)


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
