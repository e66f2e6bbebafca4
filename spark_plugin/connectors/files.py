"""File connectors: JSON-lines and Parquet sources with offsets, and a JSON-lines sink committed on checkpoints.

Files are assigned to source subtasks round robin in name order (file ``k`` to subtask ``k % parallelism``); the
offsets say where each file a subtask touched stands (``{"files": {"k": byte offset or row, or -1 when read}}``),
so a restore resumes at the record after the checkpoint, also at another parallelism.
"""

from __future__ import annotations

import glob
import json
import os
import uuid
from pathlib import Path
from typing import Any

from spark_plugin.connectors.base import Sink, Source


def _expand(paths: str | list[str], suffixes: tuple[str, ...]) -> list[str]:
    found: list[str] = []
    for p in [paths] if isinstance(paths, str) else paths:
        if os.path.isdir(p):
            found += [str(f) for f in sorted(Path(p).iterdir()) if f.is_file() and f.name.endswith(suffixes)]
        else:
            found += sorted(glob.glob(p)) or [p]
    return sorted(dict.fromkeys(found))


DONE = -1
"""The position of a file that was read to its end."""


class _FileSource(Source):
    """Each file is a split: file ``g`` (in name order) is read by subtask ``g % parallelism``, which reads its
    files one after the other. Offsets say where each file it touched stands: a byte or row position, or done."""

    suffixes: tuple[str, ...] = ()

    def __init__(self, paths: str | list[str]) -> None:
        self.paths = paths
        self.file = 0
        self.position = 0
        self.progress: dict[int, int] = {}
        """Position of each file this subtask has touched, by global file index (``DONE`` when read)."""

    def open(self, subtask_index: int, parallelism: int) -> None:
        super().open(subtask_index, parallelism)
        files = _expand(self.paths, self.suffixes)
        missing = [f for f in files if not os.path.exists(f)]
        if missing:
            raise FileNotFoundError(f"{type(self).__name__}: no such file {missing[0]!r}")
        self.indexes = list(range(subtask_index, len(files), parallelism))
        self.files = [files[g] for g in self.indexes]
        self._resume({})

    def _resume(self, progress: dict[int, int]) -> None:
        """Continue at the first file of this subtask that is not done, where ``progress`` says it stands."""
        self.close()
        self.progress = {g: progress[g] for g in self.indexes if g in progress}
        self.file = 0
        while self.file < len(self.indexes) and self.progress.get(self.indexes[self.file]) == DONE:
            self.file += 1
        self.position = self.progress.get(self.indexes[self.file], 0) if self.file < len(self.indexes) else 0

    def _next_file(self) -> None:
        """The current file was read to its end."""
        self.progress[self.indexes[self.file]] = DONE
        self.file += 1
        while self.file < len(self.indexes) and self.progress.get(self.indexes[self.file]) == DONE:
            self.file += 1
        self.position = self.progress.get(self.indexes[self.file], 0) if self.file < len(self.indexes) else 0

    def offsets(self) -> dict[str, Any]:
        progress = dict(self.progress)
        if self.file < len(self.indexes):
            progress[self.indexes[self.file]] = self.position
        return {"files": {str(g): pos for g, pos in sorted(progress.items())}}

    def seek(self, offsets: dict[str, Any]) -> None:
        self._resume(self._progress_of(offsets, self.subtask_index, self.parallelism))

    def restore_positions(self, positions: list[dict[str, Any]]) -> None:
        merged: dict[int, int] = {}
        for old_index, offsets in enumerate(positions):
            merged.update(self._progress_of(offsets, old_index, len(positions)))
        self._resume(merged)

    @staticmethod
    def _progress_of(offsets: dict[str, Any], subtask_index: int, parallelism: int) -> dict[int, int]:
        if "files" in offsets:
            return {int(g): int(pos) for g, pos in offsets["files"].items()}
        # offsets of the first version of these sources: the k-th file of the subtask, and a position in it
        k, position = int(offsets.get("file", 0)), int(offsets.get("position", 0))
        progress = {subtask_index + i * parallelism: DONE for i in range(k)}
        progress[subtask_index + k * parallelism] = position
        return progress


class JsonLinesSource(_FileSource):
    """One record (the parsed JSON value) per line of ``*.jsonl``/``*.json`` files; offsets are byte positions."""

    suffixes = (".jsonl", ".json", ".ndjson")

    def __init__(self, paths: str | list[str]) -> None:
        super().__init__(paths)
        self._handle = None

    def poll(self, max_records: int) -> list[Any] | None:
        out: list[Any] = []
        while len(out) < max_records:
            if self.file >= len(self.files):
                return out or None
            if self._handle is None:
                self._handle = open(self.files[self.file], "rb")  # noqa: SIM115 - kept open across polls
                self._handle.seek(self.position)
            line = self._handle.readline()
            if not line:
                self._handle.close()
                self._handle = None
                self._next_file()
                continue
            self.position += len(line)
            if line.strip():
                out.append(json.loads(line))
        return out

    def close(self) -> Any:
        if getattr(self, "_handle", None) is not None:
            self._handle.close()
            self._handle = None
        return None


class ParquetSource(_FileSource):
    """One record (a dict of the row) per row of ``*.parquet`` files; offsets are row numbers."""

    suffixes = (".parquet",)

    def __init__(self, paths: str | list[str], batch_rows: int = 1024) -> None:
        super().__init__(paths)
        self.batch_rows = batch_rows
        self._rows: list[dict] = []
        self._batches = None

    def _open_file(self) -> None:
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(self.files[self.file])
        self._batches = pf.iter_batches(batch_size=self.batch_rows)
        skip = self.position
        self._rows = []
        while skip > 0:
            batch = next(self._batches, None)
            if batch is None:
                break
            if batch.num_rows <= skip:
                skip -= batch.num_rows
                continue
            self._rows = batch.to_pylist()[skip:]
            skip = 0

    def poll(self, max_records: int) -> list[Any] | None:
        out: list[Any] = []
        while len(out) < max_records:
            if self.file >= len(self.files):
                return out or None
            if self._batches is None:
                self._open_file()
            if not self._rows:
                batch = next(self._batches, None)
                if batch is None:
                    self._batches = None
                    self._next_file()
                    continue
                self._rows = batch.to_pylist()
            take = self._rows[: max_records - len(out)]
            del self._rows[: len(take)]
            out.extend(take)
            self.position += len(take)
        return out

    def close(self) -> Any:
        self._batches = None
        self._rows = []
        return None


class FileSink(Sink):
    """Writes JSON lines; a checkpoint's output becomes visible (renamed into ``directory``) when it completes.

    Records go to an in-progress file under ``directory/.inprogress``; a snapshot closes it into
    ``directory/.pending`` (its name carries the checkpoint id); ``checkpoint.completed`` renames pending files
    into ``directory`` as ``part-<job>-<subtask>-<checkpoint>.jsonl``. A restore commits the files of the restored
    checkpoint; ``rewind`` deletes the failed attempt's leftovers and withdraws (deletes) committed files of
    checkpoints after the restored one, which the new attempt writes again. So every record appears exactly once.
    """

    commits_on_checkpoints = True

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
        return self.root / ".inprogress" / f"part-{self.job_id}-{self.subtask_index}-{self._run}.jsonl"

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
            name = f"part-{self.job_id}-{self.subtask_index}-{checkpoint_id:08d}.jsonl"
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
        for f in directory.glob(f"part-{job_id}-*.jsonl"):
            parts = f.name[: -len(".jsonl")].split("-")
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
