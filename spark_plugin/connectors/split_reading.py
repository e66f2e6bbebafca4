"""The runtime's side of the partitioned source contract: which subtask reads which split, and one subtask's
reading of its splits (positions, round robin, discovery of new splits, pausing, restore at any parallelism).

A connector never decides any of this: it lists its splits and reads one (``PartitionedSource``, ``SplitReader``).
"""

from __future__ import annotations

import re
import time
import zlib
from collections.abc import Callable
from typing import Any

_NUMBERED = re.compile(r"^(.*?)(\d+)$", re.DOTALL)


def split_owner(split: str, parallelism: int) -> int:
    """The subtask index (of ``parallelism``) that reads ``split``: a function of the split id alone, so every
    subtask computes the same owner without talking, and a split listed later changes no other split's owner.

    An id that ends in a number goes round robin by that number from a start given by the rest of the id
    (``orders-0``, ``orders-1``, ... spread over the subtasks as evenly as they can; ``7`` is subtask ``7 % p``);
    any other id (a file name) by a stable hash (CRC-32), the same in every process."""
    m = _NUMBERED.match(split)
    if m is None:
        return zlib.crc32(split.encode()) % parallelism
    prefix, number = m.groups()
    return (zlib.crc32(prefix.encode()) + int(number)) % parallelism


POSITION_CHARS = 64
"""A split's position in the live metrics is cut to this many characters (the checkpoint keeps all of it)."""


def short_position(position: Any) -> str | None:
    """A position for people to read: a Kafka offset as ``42``, anything else as its JSON-like text, cut short."""
    if position is None:
        return None
    text = str(position)
    return text if len(text) <= POSITION_CHARS else text[: POSITION_CHARS - 1] + "…"


def is_split_offsets(offsets: dict[str, Any]) -> bool:
    return "split_positions" in offsets


class SplitReading:
    """The splits one source subtask owns, each with a position and (once read) a reader.

    ``poll`` reads round robin: each call takes a batch from the next split that has records, so every split gets
    its turn and the loop never waits on one. ``current`` is the split of the last batch. The next split to read is
    part of the offsets, so a restore at the same parallelism goes on in the order the run without failures took
    (given the same batch sizes: the subtask asks for a fixed number of records per poll)."""

    def __init__(self, source: Any, subtask_index: int, parallelism: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self.index = subtask_index
        self.parallelism = parallelism
        self.clock = clock
        self.positions: dict[str, Any] = {}
        """Position of every split this subtask owns (None: not read yet); an ended split keeps its last one."""
        self.finished: set[str] = set()
        """Splits this subtask owns that ended."""
        self.readers: dict[str, Any] = {}
        self.order: list[str] = []
        self.turn = 0
        self.current: str | None = None
        self.paused = False
        self._next_discovery = 0.0

    # ------------------------------------------------------------------ which splits

    def start(self, offsets: dict[str, Any]) -> None:
        """Take the splits this subtask owns out of ``offsets`` (every old subtask's, merged) and of the source's
        current list, each at its position in ``offsets`` (a split absent from them starts at its beginning)."""
        self.close()
        positions = dict(offsets.get("split_positions") or {})
        finished = set(offsets.get("finished_splits") or [])
        self.source.restored_splits = sorted(set(positions) | finished)
        self.positions, self.finished = {}, set()
        for split in sorted(set(positions) | finished):
            if self._owns(split):
                self.positions[split] = positions.get(split)
                if split in finished:
                    self.finished.add(split)
        self._order(offsets.get("next_split"))
        self._discover()

    def _owns(self, split: str) -> bool:
        return split_owner(split, self.parallelism) == self.index

    def _discover(self) -> None:
        """Add the splits of the source's list that this subtask owns and does not know yet."""
        interval = self.source.discovery_interval
        self._next_discovery = self.clock() + interval if interval else float("inf")
        listed = self.source.list_splits()
        bad = [s for s in listed if not isinstance(s, str)]
        if bad:
            raise TypeError(f"{type(self.source).__name__}.list_splits() returned {bad[0]!r}: split ids are str")
        new = [s for s in listed if s not in self.positions and self._owns(s)]
        for split in sorted(new):
            self.positions[split] = None
            self.order.append(split)

    def _order(self, next_split: str | None) -> None:
        self.order = sorted(set(self.positions) - self.finished)
        self.turn = self.order.index(next_split) if next_split in self.order else 0

    def splits(self) -> list[str]:
        """The splits this subtask reads or read (ended ones too)."""
        return sorted(self.positions)

    # ------------------------------------------------------------------ reading

    def poll(self, max_records: int) -> list[Any] | None:
        if self.clock() >= self._next_discovery:
            self._discover()
        n = len(self.order)
        for _ in range(n):
            if not self.order:
                break
            self.turn %= len(self.order)
            split = self.order[self.turn]
            reader = self._reader(split)
            batch = reader.poll(max_records)
            self.positions[split] = reader.position()
            if batch is None:
                self._finish(split)
                continue  # the next split takes this turn
            self.turn += 1
            if batch:
                self.current = split
                return batch
        if not self.order and self.source.discovery_interval is None:
            return None  # every split ended and no new one can come
        return []

    def _reader(self, split: str) -> Any:
        reader = self.readers.get(split)
        if reader is None:
            reader = self.readers[split] = self.source.build_split_reader(split, self.positions[split])
            if self.paused:
                reader.pause()
        return reader

    def _finish(self, split: str) -> None:
        self.readers.pop(split).close()
        self.finished.add(split)
        i = self.order.index(split)
        del self.order[i]
        if i < self.turn:
            self.turn -= 1

    def wait_hint(self) -> float | None:
        hints = [h for r in self.readers.values() if (h := r.wait_hint()) is not None]
        if self.source.discovery_interval:
            hints.append(max(self._next_discovery - self.clock(), 0.0))
        return min(hints) if hints else None

    def pause(self) -> None:
        if not self.paused:
            self.paused = True
            for r in self.readers.values():
                r.pause()

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            for r in self.readers.values():
                r.resume()

    # ------------------------------------------------------------------ live metrics

    def metrics(self, limit: int) -> dict[str, Any]:
        """The first ``limit`` splits (by id) with their position as a short string and their lag (the reader's
        :meth:`~SplitReader.lag`; 0 once ended; None when unknown or not read yet), and how many more there are.
        Reads only what the readers hold: no broker or file is asked."""
        out = []
        for split in sorted(self.positions)[:limit]:
            if split in self.finished:
                lag: int | None = 0
            else:
                reader = self.readers.get(split)
                lag = reader.lag() if reader is not None else None
            out.append({"split": split, "position": short_position(self.positions[split]), "lag": lag})
        return {"splits": out, "splits_more": max(len(self.positions) - limit, 0)}

    # ------------------------------------------------------------------ checkpoints

    def offsets(self) -> dict[str, Any]:
        """This subtask's part of a checkpoint: every split's position, the splits that ended, the next to read."""
        out: dict[str, Any] = {
            "split_positions": dict(sorted(self.positions.items())),
            "finished_splits": sorted(self.finished),
        }
        if self.order:
            out["next_split"] = self.order[self.turn % len(self.order)]
        return out

    def restore(self, offsets_by_subtask: dict[int, dict[str, Any]], parallelism: int) -> None:
        """Resume from the offsets of old subtasks (by index, of ``parallelism``): merged, then :meth:`start`. The
        next split to read comes from the old subtask with this index, if it exists."""
        merged: dict[str, Any] = {"split_positions": {}, "finished_splits": []}
        for old_index, offsets in sorted(offsets_by_subtask.items()):
            if not is_split_offsets(offsets):
                offsets = self.source.legacy_offsets(offsets, old_index, parallelism)
            merged["split_positions"].update(offsets.get("split_positions") or {})
            merged["finished_splits"] += offsets.get("finished_splits") or []
            if old_index == self.index:
                merged["next_split"] = offsets.get("next_split")
        self.start(merged)

    def close(self) -> None:
        for r in self.readers.values():
            r.close()
        self.readers = {}
