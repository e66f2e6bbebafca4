"""File connectors: JSON-lines and Parquet sources with offsets, and a JSON-lines sink committed on checkpoints.

Both sources have a batch form (``batches=True``): each record is a ``pyarrow.RecordBatch`` of up to
``batch_rows`` rows (a batch stream, see ``spark_plugin.api.pipeline.BatchStream``), positions still counted in rows or bytes.

Each file is a split of a partitioned source (named by its path): the runtime assigns files to source subtasks and
keeps where each one stands (a byte offset or a row), so a restore resumes at the record after the checkpoint, also
at another parallelism, and files that appear while running are read with ``discovery_interval``.
"""

from __future__ import annotations

import glob
import json
import os
import uuid
from pathlib import Path
from typing import Any

from spark_plugin.connectors.base import PartitionedSource, Sink, SplitReader


def _expand(paths: str | list[str], suffixes: tuple[str, ...]) -> list[str]:
    found: list[str] = []
    for p in [paths] if isinstance(paths, str) else paths:
        if os.path.isdir(p):
            found += [str(f) for f in sorted(Path(p).iterdir()) if f.is_file() and f.name.endswith(suffixes)]
        else:
            found += sorted(glob.glob(p)) or [p]
    return sorted(dict.fromkeys(found))


DONE = -1
"""The position of a file that was read to its end, in offsets written before files were splits."""


class _FileSource(PartitionedSource):
    """Each file is a split, named by its path: the runtime assigns files to subtasks and keeps each file's position
    (a byte or row position). With ``discovery_interval`` (seconds) the paths are listed again while running and new
    files are read too; the source then never ends."""

    suffixes: tuple[str, ...] = ()

    def __init__(self, paths: str | list[str], discovery_interval: float | None = None) -> None:
        self.paths = paths
        self.discovery_interval = discovery_interval

    def list_splits(self) -> list[str]:
        files = _expand(self.paths, self.suffixes)
        missing = [f for f in files if not os.path.exists(f)]
        if missing:
            raise FileNotFoundError(f"{type(self).__name__}: no such file {missing[0]!r}")
        return files

    def legacy_offsets(self, offsets: dict[str, Any], subtask_index: int, parallelism: int) -> dict[str, Any]:
        """Offsets by file index in name order (``{"files": {"k": position or -1}}``, or the first version's
        ``{"file": k-th file of the subtask, "position": p}``), for the files listed now."""
        files = _expand(self.paths, self.suffixes)
        if "files" in offsets:
            progress = {int(g): int(pos) for g, pos in offsets["files"].items()}
        else:
            k, position = int(offsets.get("file", 0)), int(offsets.get("position", 0))
            progress = {subtask_index + i * parallelism: DONE for i in range(k)}
            progress[subtask_index + k * parallelism] = position
        progress = {g: pos for g, pos in progress.items() if g < len(files)}
        return {
            "split_positions": {files[g]: pos for g, pos in progress.items() if pos != DONE},
            "finished_splits": [files[g] for g, pos in progress.items() if pos == DONE],
        }


class JsonLinesSource(_FileSource):
    """One record (the parsed JSON value) per line of ``*.jsonl``/``*.json`` files; positions are byte offsets.
    With ``batches=True`` each record is a ``pyarrow.RecordBatch`` of up to ``batch_rows`` lines (JSON objects)."""

    suffixes = (".jsonl", ".json", ".ndjson")

    def __init__(self, paths: str | list[str], discovery_interval: float | None = None, *, batches: bool = False,
                 batch_rows: int = 1024) -> None:
        super().__init__(paths, discovery_interval)
        self.batches = batches
        self.batch_rows = batch_rows

    def build_split_reader(self, split: str, position: Any | None) -> SplitReader:
        return _JsonLinesReader(split, int(position or 0), self.batch_rows if self.batches else None)


class _JsonLinesReader(SplitReader):
    def __init__(self, path: str, position: int, batch_rows: int | None = None) -> None:
        self.path, self.pos, self.batch_rows = path, position, batch_rows
        self._handle = None

    def poll(self, max_records: int) -> list[Any] | None:
        if self._handle is None:
            self._handle = open(self.path, "rb")  # noqa: SIM115 - kept open across polls
            self._handle.seek(self.pos)
        if self.batch_rows is not None:  # the batch form: one RecordBatch of up to batch_rows lines
            rows = self._lines(self.batch_rows)
            if rows is None:
                return None
            import pyarrow as pa

            return [pa.RecordBatch.from_pylist(rows)] if rows else []
        return self._lines(max_records)

    def _lines(self, limit: int) -> list[Any] | None:
        out: list[Any] = []
        while len(out) < limit:
            line = self._handle.readline()
            if not line:
                return out or None
            self.pos += len(line)
            if line.strip():
                out.append(json.loads(line))
        return out

    def position(self) -> Any:
        return self.pos

    def lag(self) -> int | None:
        """Bytes left in the file (one ``fstat`` of the open file; None before the first read)."""
        if self._handle is None:
            return None
        return max(os.fstat(self._handle.fileno()).st_size - self.pos, 0)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


class ParquetSource(_FileSource):
    """One record (a dict of the row) per row of ``*.parquet`` files; positions are row numbers. With
    ``batches=True`` each record is a ``pyarrow.RecordBatch`` of up to ``batch_rows`` rows, as the file holds them."""

    suffixes = (".parquet",)

    def __init__(self, paths: str | list[str], batch_rows: int = 1024, discovery_interval: float | None = None, *,
                 batches: bool = False) -> None:
        super().__init__(paths, discovery_interval)
        self.batch_rows = batch_rows
        self.batches = batches

    def build_split_reader(self, split: str, position: Any | None) -> SplitReader:
        return _ParquetReader(split, int(position or 0), self.batch_rows, self.batches)


class _ParquetReader(SplitReader):
    def __init__(self, path: str, position: int, batch_rows: int, batches: bool = False) -> None:
        self.path, self.pos, self.batch_rows, self.as_batches = path, position, batch_rows, batches
        self._rows: list[dict] = []
        self._batches = None
        self._first = None  # the batch form: the rest of the batch a restore's position falls into
        self._num_rows: int | None = None

    def _open(self) -> None:
        import pyarrow.parquet as pq

        f = pq.ParquetFile(self.path)
        self._num_rows = f.metadata.num_rows
        self._batches = f.iter_batches(batch_size=self.batch_rows)
        skip = self.pos
        while skip > 0:
            batch = next(self._batches, None)
            if batch is None:
                break
            if batch.num_rows <= skip:
                skip -= batch.num_rows
                continue
            if self.as_batches:
                self._first = batch.slice(skip)
            else:
                self._rows = batch.to_pylist()[skip:]
            skip = 0

    def poll(self, max_records: int) -> list[Any] | None:
        if self._batches is None:
            self._open()
        if self.as_batches:
            batch, self._first = (self._first, None) if self._first is not None else (next(self._batches, None), None)
            if batch is None:
                return None
            self.pos += batch.num_rows
            return [batch] if batch.num_rows else []
        out: list[Any] = []
        while len(out) < max_records:
            if not self._rows:
                batch = next(self._batches, None)  # type: ignore[call-overload]
                if batch is None:
                    return out or None
                self._rows = batch.to_pylist()
            take = self._rows[: max_records - len(out)]
            del self._rows[: len(take)]
            out.extend(take)
            self.pos += len(take)
        return out

    def position(self) -> Any:
        return self.pos

    def lag(self) -> int | None:
        """Rows left, from the row count in the file's footer (None before the first read)."""
        return None if self._num_rows is None else max(self._num_rows - self.pos, 0)

    def close(self) -> None:
        self._batches = None
        self._rows = []


class FileSink(Sink):
    """Writes JSON lines; a checkpoint's output becomes visible (renamed into ``directory``) when it completes.

    Records go to an in-progress file under ``directory/.inprogress``; a snapshot closes it into
    ``directory/.pending`` (its name carries the checkpoint id); ``checkpoint.completed`` renames pending files
    into ``directory`` as ``part-<job>-<subtask>-<checkpoint>.jsonl``. A restore commits the files of the restored
    checkpoint; ``rewind`` deletes the failed attempt's leftovers and withdraws (deletes) committed files of
    checkpoints after the restored one, which the new attempt writes again. So every record appears exactly once.
    """

    commits_on_checkpoints = True
    suffix = ".jsonl"

    def __init__(self, directory: str, encoder=json.dumps) -> None:
        self.directory = directory
        self.encoder = encoder
        self.pending: list[tuple[int, str]] = []
        self._handle = None
        self._count = 0
        self.committed: list[str] = []
        self.withdrawn: list[str] = []

    def open(self, subtask_index: int, parallelism: int) -> None:
        super().open(subtask_index, parallelism)
        self.root = Path(self.directory)
        for d in (self.root, self.root / ".inprogress", self.root / ".pending"):
            d.mkdir(parents=True, exist_ok=True)
        self._run = uuid.uuid4().hex[:8]

    def _inprogress(self) -> Path:
        return self.root / ".inprogress" / f"part-{self.job_id}-{self.subtask_index}-{self._run}{self.suffix}"

    def write(self, record: Any) -> None:
        if self._handle is None:
            self._handle = open(self._inprogress(), "a", encoding="utf-8")  # noqa: SIM115
        self._handle.write(self.encoder(record))
        self._handle.write("\n")
        self._count += 1

    def snapshot(self, checkpoint_id: int) -> Any:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
            name = f"part-{self.job_id}-{self.subtask_index}-{checkpoint_id:08d}{self.suffix}"
            os.replace(self._inprogress(), self.root / ".pending" / name)
            self.pending.append((checkpoint_id, name))
        return {"pending": list(self.pending)}

    def _commit(self, name: str) -> None:
        src, dst = self.root / ".pending" / name, self.root / name
        if src.exists():
            os.replace(src, dst)
        if dst.exists():
            self.committed.append(name)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        keep = []
        for cid, name in self.pending:
            if cid <= checkpoint_id:
                self._commit(name)
            else:
                keep.append((cid, name))
        self.pending = keep

    def uncommitted(self) -> bool:
        return bool(self.pending) or self._handle is not None

    def _files_of_job(self, directory: Path, job_id: int):
        """``(path, subtask, checkpoint-or-run)`` of this job's part files in ``directory``."""
        for f in directory.glob(f"part-{job_id}-*{self.suffix}"):
            parts = f.name[: -len(self.suffix)].split("-")
            if len(parts) == 4 and parts[2].isdigit():
                yield f, int(parts[2]), parts[3]

    def rewind(self, job_id: int, checkpoint_id: int | None) -> None:
        """Withdraw committed files of the job's checkpoints after ``checkpoint_id``; delete the failed
        attempt's pending and in-progress files of this subtask (and of subtasks that no longer exist)."""
        super().rewind(job_id, checkpoint_id)
        after = -1 if checkpoint_id is None else checkpoint_id
        for f, _, cid in self._files_of_job(self.root, job_id):
            if cid.isdigit() and int(cid) > after:
                f.unlink(missing_ok=True)  # another subtask of the sink may withdraw it at the same time
                self.withdrawn.append(f.name)
        # other live subtasks of this attempt may already write and snapshot: only touch files nobody owns now
        ours = lambda sub: sub == self.subtask_index or sub >= self.parallelism  # noqa: E731
        for f, sub, cid in self._files_of_job(self.root / ".pending", job_id):
            if ours(sub) and cid.isdigit() and int(cid) > after:
                f.unlink(missing_ok=True)
        for f, sub, _ in self._files_of_job(self.root / ".inprogress", job_id):
            if ours(sub):
                f.unlink(missing_ok=True)

    def restore(self, state: Any) -> None:
        for name in sorted({name for _, name in state["pending"]}):
            self._commit(name)  # part of a completed checkpoint: visible now
        self.pending = []

    def close(self) -> Any:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        return {"written": self._count, "committed": list(self.committed), "pending": list(self.pending),
                "withdrawn": list(self.withdrawn)}
