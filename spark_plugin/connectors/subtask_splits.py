"""An older ``Source`` (``poll``/``offsets``/``seek``, no splits of its own) read as a partitioned source: each
subtask of the job's first run is one split, so the runtime can move it whole and the source rescales too.

Split ``"n:j"`` is what subtask ``j`` of ``n`` read on the first run; its reader is a copy of the source opened as
that subtask and positioned with ``seek`` at the split's position (the source's own offsets). Scaled in, a subtask
reads several such splits; scaled out past ``n``, the extra subtasks have none (the source says nothing finer).
"""

from __future__ import annotations

import copy
from typing import Any

from spark_plugin.connectors.base import PartitionedSource, Source, SplitReader


def as_partitioned(source: Source) -> Source:
    """``source`` as a partitioned source: itself if it is one; wrapped in :class:`SubtaskSplits` if it neither
    splits its positions (``restore_positions``) nor its event time (``partitions``) itself; else as it is."""
    if isinstance(source, PartitionedSource):
        return source
    cls = type(source)
    if cls.restore_positions is not Source.restore_positions or cls.partitions is not Source.partitions:
        return source  # it knows its splits better than one per subtask: the compatible path
    return SubtaskSplits(source)


class SubtaskSplits(PartitionedSource):
    """One split per subtask of the job's first run of an older ``Source``."""

    def __init__(self, source: Source) -> None:
        self.source = source

    def list_splits(self) -> list[str]:
        n = int(self.restored_splits[0].split(":")[0]) if self.restored_splits else self.parallelism
        return [f"{n}:{j}" for j in range(n)]

    def build_split_reader(self, split: str, position: Any | None) -> SplitReader:
        n, j = (int(x) for x in split.split(":"))
        return _SubtaskReader(copy.deepcopy(self.source), j, n, position)

    def legacy_offsets(self, offsets: dict[str, Any], subtask_index: int, parallelism: int) -> dict[str, Any]:
        """The source's own offsets, taken by subtask ``subtask_index`` of ``parallelism``: that split's position."""
        return {"split_positions": {f"{parallelism}:{subtask_index}": offsets}}


class _SubtaskReader(SplitReader):
    def __init__(self, source: Source, j: int, n: int, position: dict[str, Any] | None) -> None:
        self.source = source
        source.open(j, n)
        if position is not None:
            source.seek(position)

    def poll(self, max_records: int) -> list[Any] | None:
        return self.source.poll(max_records)

    def position(self) -> Any:
        return self.source.offsets()

    def wait_hint(self) -> float | None:
        return self.source.wait_hint()

    def pause(self) -> None:
        self.source.pause()

    def resume(self) -> None:
        self.source.resume()

    def close(self) -> None:
        self.source.close()
