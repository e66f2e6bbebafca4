"""The file:// blob store: a directory the executors share, written durably (staged, fsynced, moved into place),
stat'ed in batches off the event loop on network file systems."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import stat as stat_mode
import tempfile
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from urllib.parse import urlparse

from app.blobstore.base import (
    CHUNK,
    MARKER,
    MARKER_MAX,
    Staged,
    _Base,
    _check_key,
    _check_prefix,
    _digest,
    _durable_move,
    _linked,
)
from app.errors import Invalid
from contract.models import WriteTarget


def _lstat_size(path: Path, seen: dict[Path, bool] | None = None) -> int | None:
    """The size of the regular file at `path`, or None: missing, not a regular file, or reached through a link."""
    try:
        st = path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_size if stat_mode.S_ISREG(st.st_mode) and not _linked(path, seen) else None


def _open_object(path: Path, mode: str = "rb"):
    """Open a stored object for reading, never through a symbolic link and only a regular file (FileNotFoundError
    otherwise, as if missing: `size` says None for the same)."""
    if _linked(path):
        raise FileNotFoundError(f"{path} is reached through a symbolic link")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FileNotFoundError(f"{path} is a symbolic link") from None
        if exc.errno == errno.ENOTDIR:
            raise FileNotFoundError(f"{path} lies under a file, not a directory") from None
        raise
    if not stat_mode.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileNotFoundError(f"{path} is not a regular file")
    return os.fdopen(fd, mode)


class _StatBatch:
    """Stats asked for in one turn of the event loop, run together in one worker thread.

    Under a burst of acks naming written objects (thousands of subtasks acking one checkpoint), one thread hop per
    stat cost more than the stat itself; here the first ``size`` of a turn schedules one hop for all stats asked
    for until the loop runs its next callbacks. A caller that stops waiting (a timeout) leaves the others be."""

    def __init__(self) -> None:
        self._pending: list[tuple[Path, asyncio.Future]] | None = None

    async def size(self, path: Path) -> int | None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        if self._pending is None:
            self._pending = []
            loop.call_soon(self._run, loop)
        self._pending.append((path, future))
        return await future

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        batch, self._pending = self._pending or [], None
        done = loop.run_in_executor(None, _lstat_sizes, [p for p, _ in batch])

        def answer(fut: asyncio.Future) -> None:
            error = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
            sizes = fut.result() if error is None else [None] * len(batch)
            for (_, waiter), size in zip(batch, sizes, strict=True):
                if waiter.done():
                    continue
                if error is not None:
                    waiter.set_exception(error)
                else:
                    waiter.set_result(size)

        done.add_done_callback(answer)


def _lstat_sizes(paths: list[Path]) -> list[int | None]:
    seen: dict[Path, bool] = {}
    return [_lstat_size(p, seen) for p in paths]


LOCAL_FILESYSTEMS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "bcachefs", "jfs", "reiserfs", "tmpfs", "ramfs", "overlay"}
)
"""File systems of a machine's own disks or memory: a stat there answers in microseconds, from the kernel's caches
for an object just written. Network file systems (NFS, SMB, Lustre, CephFS, FUSE mounts) are not among them: a
stat there can wait for a server, as long as the server takes."""


def filesystem_type(path: Path, mounts: str | None = None) -> str | None:
    """The type of the file system `path` lies on: that of the longest mount point above it in the kernel's mount
    table (Linux's, or `mounts` in its format), or None where there is no such table."""
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return None
    where, best, found = str(path), -1, None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (where == point or where.startswith(point.rstrip("/") + "/")) and len(point) > best:
            best, found = len(point), fields[2]
    return found


def _remove(path: Path) -> None:
    """Remove a file, a link or a directory tree; nothing if it is not there (or only reached through a link)."""
    if _linked(path):
        return
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass


def _prune_dir(directory: Path, keep: set[str]) -> list[str]:
    if _linked(directory) or directory.is_symlink():
        return []
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    removed = []
    for entry in entries:
        if entry.name not in keep:
            _remove(Path(entry.path))
            removed.append(entry.name)
    return removed


class FileBlobStore(_Base):
    """A local directory, which executors on other machines share (a network file system): subtasks write their
    objects there themselves; confinement to their checkpoint's prefix is the coordinator refusing acks of any key
    outside it."""

    def __init__(self, url: str) -> None:
        self.url = url
        parsed = urlparse(url)
        self.root = Path(parsed.path).resolve()
        self.staging_dir = self.root / ".staging"
        self._stats = _StatBatch()
        self.local = filesystem_type(self.root) in LOCAL_FILESYSTEMS
        """The directory is on a local file system: an ack's stat runs on the event loop, where it takes
        microseconds. A hop to a worker thread costs more on a busy machine (the thread must be scheduled: several
        milliseconds with every core taken by the pipeline's workers). On a network file system the stats stay off
        the event loop, so a server that stops answering holds the acks' checks (bounded by their timeout), never
        the coordinator."""

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    async def commit(self, staged: Staged, key: str) -> None:
        # fsync the file, move it into place, fsync the directory: off the event loop, which serves the acks.
        await asyncio.to_thread(_durable_move, staged.path, self._path(key))

    async def size(self, key: str) -> int | None:
        if self.local:
            return _lstat_size(self._path(key))
        return await self._stats.size(self._path(key))

    async def sizes(self, keys: list[str]) -> list[int | None | BaseException]:
        if not keys:
            return []
        if self.local:
            sizes: list[int | None | BaseException] = []
            seen: dict[Path, bool] = {}
            for k in keys:
                try:
                    sizes.append(_lstat_size(self._path(k), seen))
                except (OSError, Invalid) as e:  # that one failed; the others are answered
                    sizes.append(e)
            return sizes
        if len(keys) == 1:
            return list(await asyncio.gather(self.size(keys[0]), return_exceptions=True))
        paths = [self._path(k) for k in keys]
        return list(await asyncio.get_running_loop().run_in_executor(None, _lstat_sizes, paths))

    async def read_range(self, key: str, start: int, end: int) -> AsyncIterator[bytes]:
        with _open_object(self._path(key)) as f:
            f.seek(start)
            remaining = end - start + 1
            while remaining > 0:
                chunk = f.read(min(CHUNK, remaining))
                if not chunk:
                    break
                remaining -= len(chunk)
                yield chunk

    async def sha256(self, key: str, start: int = 0, length: int | None = None) -> str | None:
        return await asyncio.to_thread(_digest, _open_object, self._path(key), start, length)

    async def delete(self, key: str) -> None:
        await asyncio.to_thread(_remove, self._path(key))

    async def delete_prefix(self, prefix: str) -> None:
        await asyncio.to_thread(_remove, self.root / _check_prefix(prefix))

    async def prune(self, prefix: str, keep: set[str]) -> list[str]:
        names = {k[len(prefix) :] for k in keep if k.startswith(prefix)}
        removed = await asyncio.to_thread(_prune_dir, self.root / _check_prefix(prefix), names)
        return [prefix + name for name in removed]

    async def write_target(self, prefix: str, expires_at: int, max_size: int) -> WriteTarget | None:
        return WriteTarget(prefix=_check_prefix(prefix), url=self.root.as_uri() + "/", expires_at=expires_at)

    async def read_urls(self, keys: Iterable[str], expires_in: int) -> dict[str, str]:
        return {key: self._path(key).as_uri() for key in keys}

    async def check(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if not os.access(self.root, os.W_OK):
            raise OSError(f"blob directory {self.root} is not writable")

    async def read_marker(self) -> bytes | None:
        def read() -> bytes | None:
            try:
                with _open_object(self.root / MARKER) as f:
                    return f.read(MARKER_MAX)
            except FileNotFoundError:
                return None

        return await asyncio.to_thread(read)

    async def write_marker(self, data: bytes) -> None:
        def write() -> None:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".marker-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.root / MARKER)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)

        await asyncio.to_thread(write)
