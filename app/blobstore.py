"""The blob store for operator and channel state, chosen by URL: file:// (a directory the executors share), s3://
(presigned writes and reads) or any other fsspec URL (state through the coordinator only).

Every object lies under its checkpoint's prefix, ``job-<id>/cp-<id, 12 digits>/`` (`checkpoint_prefix`), so a
checkpoint's state is deleted by prefix. Under it: the blobs uploaded through the coordinator (named by the ids it
issued) and the objects subtasks write themselves (one per subtask, named by the runtime, within the prefix the
coordinator scoped its write target to). Blobs stored before this layout keep their keys ``job-<id>/<blob id>``.
No client-supplied name becomes a path unless it matches the key patterns below. Uploads are streamed to a
staging file while their sha256 and size are computed; only a verified upload is moved into place.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import re
import shutil
import stat as stat_mode
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from app.errors import Conflict, DomainError, Invalid, TooLarge, Unavailable
from app.registry import SchemeRegistry
from contract.models import STATE_KEY_PATTERN, WriteTarget, state_prefix

MARKER = ".overtake-deployment"
"""The object at a blob store's root that names the deployment whose checkpoints it holds (`claim`)."""
MARKER_MAX = 4096
LEGACY_KEY_RE = re.compile(r"^job-[0-9]+/[0-9a-f]{32}$")
STATE_KEY_RE = re.compile(STATE_KEY_PATTERN)
PREFIX_RE = re.compile(r"^job-[0-9]{1,19}/cp-[0-9]{12,19}/$")
CHUNK = 1024 * 1024


def is_key(key: str) -> bool:
    """Whether `key` is an object key of this store's layout (under a checkpoint's prefix, or a legacy blob key)."""
    return bool(STATE_KEY_RE.fullmatch(key) or LEGACY_KEY_RE.fullmatch(key))


def _check_key(key: str) -> str:
    if not is_key(key):
        raise Invalid(f"not a blob key: {key!r}")
    return key


def _check_prefix(prefix: str) -> str:
    if not PREFIX_RE.fullmatch(prefix):
        raise Invalid(f"not a checkpoint prefix: {prefix!r}")
    return prefix


def checkpoint_prefix(job_id: int, checkpoint_id: int) -> str:
    """The prefix of a checkpoint's objects: ``job-7/cp-000000000012/``."""
    return _check_prefix(state_prefix(job_id, checkpoint_id))


@asynccontextmanager
async def store_answers(what: str):
    """Whatever the store's client raises while the store is asked `what` (it is unreachable, or refuses) becomes a
    503 saying so: the request changed nothing and may be retried once the store answers. A missing object is no
    failure (the store's methods say None for it), and the coordinator's own refusals pass unchanged."""
    try:
        yield
    except DomainError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the store's client raised
        raise Unavailable(
            f"the blob store did not answer {what} ({type(exc).__name__}); nothing was changed; retry once it answers"
        ) from exc


@dataclass
class Staged:
    """A verified upload waiting to be committed into the store."""

    path: Path
    size: int
    sha256: str

    def discard(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


def _digest(opener, path, start: int = 0, length: int | None = None) -> str | None:
    """sha256 of a stored blob (``length`` bytes from ``start`` of its object, or the rest), read in chunks; None
    if it is missing."""
    try:
        h = hashlib.sha256()
        with opener(path, "rb") as f:
            f.seek(start)
            remaining = length
            while remaining is None or remaining > 0:
                chunk = f.read(CHUNK if remaining is None else min(CHUNK, remaining))
                if not chunk:
                    break
                h.update(chunk)
                if remaining is not None:
                    remaining -= len(chunk)
        return h.hexdigest()
    except FileNotFoundError:
        return None


def _durable_move(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if _linked(dest):
        raise Conflict(
            f"the blob store's directory for {dest.parent.name} is reached through a symbolic link; the coordinator "
            "stores nothing through one; nothing was stored"
        )
    with open(src, "rb") as f:
        os.fsync(f.fileno())
    os.replace(src, dest)
    dir_fd = os.open(dest.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def new_blob_id() -> str:
    return uuid.uuid4().hex


def blob_key(job_id: int, blob_id: str) -> str:
    """The key of a blob stored before the per-checkpoint layout (its row has no key)."""
    key = f"job-{int(job_id)}/{blob_id}"
    if not LEGACY_KEY_RE.fullmatch(key):
        raise Invalid(f"blob id {blob_id!r} is not a blob id issued by this coordinator")
    return key


def upload_key(job_id: int, checkpoint_id: int, blob_id: str) -> str:
    """The key of a blob uploaded through the coordinator: under its checkpoint's prefix, named by its id."""
    if not re.fullmatch(r"[0-9a-f]{32}", blob_id):
        raise Invalid(f"blob id {blob_id!r} is not a blob id issued by this coordinator")
    return checkpoint_prefix(job_id, checkpoint_id) + blob_id


class BlobStore(Protocol):
    url: str
    presigned: bool  # its write targets and read URLs are presigned (they expire)

    async def stage(
        self, chunks: AsyncIterator[bytes], expected_sha256: str, max_size: int, said_by: str = "X-Overtake-Sha256"
    ) -> Staged: ...
    async def commit(self, staged: Staged, key: str) -> None: ...
    async def size(self, key: str) -> int | None:
        """The size of the object (a regular file, not a directory or a link), or None if there is none; a stat
        or HEAD, never a read. Off the event loop, except a stat on a local file system (`FileBlobStore.local`)."""

    async def sizes(self, keys: list[str]) -> list[int | None | BaseException]:
        """``size`` of each key (an exception where that one failed), as few hops off the event loop as the store
        allows: the acks of one batch request are checked together."""

    def read_range(self, key: str, start: int, end: int) -> AsyncIterator[bytes]: ...
    async def sha256(self, key: str, start: int = 0, length: int | None = None) -> str | None: ...
    async def delete(self, key: str) -> None: ...
    async def delete_prefix(self, prefix: str) -> None:
        """Delete everything under a checkpoint's prefix (nothing when there is nothing)."""

    async def prune(self, prefix: str, keep: set[str]) -> list[str]:
        """Delete everything under a checkpoint's prefix but the objects `keep` names; returns what it deleted."""

    async def write_target(self, prefix: str, expires_at: int, max_size: int) -> WriteTarget | None:
        """Where subtasks write under `prefix` themselves until `expires_at` (ms), or None: through the coordinator."""

    async def read_urls(self, keys: Iterable[str], expires_in: int) -> dict[str, str]:
        """URLs a subtask reads the objects from itself (empty: through the coordinator)."""

    async def check(self) -> None: ...

    async def read_marker(self) -> bytes | None:
        """The deployment marker at the store's root (`claim`), or None when there is none."""

    async def write_marker(self, data: bytes) -> None: ...


class _Base:
    """Staging is local for every backend: hash and size-check before anything reaches the store."""

    staging_dir: Path

    async def sizes(self, keys: list[str]) -> list[int | None | BaseException]:
        return list(await asyncio.gather(*(self.size(k) for k in keys), return_exceptions=True))
    presigned = False

    async def stage(
        self, chunks: AsyncIterator[bytes], expected_sha256: str, max_size: int, said_by: str = "X-Overtake-Sha256"
    ) -> Staged:
        """Stage an upload, checked against `expected_sha256`; `said_by`: where that digest came from, for the
        messages (the upload's header, or the report of `acks/with-state`)."""
        expected = expected_sha256.lower()
        if not re.fullmatch(r"[0-9a-f]{64}", expected):
            raise Invalid(f"{said_by} {expected_sha256!r} is not a hex sha256 digest (64 hex characters)")
        self.staging_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self.staging_dir, prefix="upload-")
        path = Path(name)
        digest = hashlib.sha256()
        size = 0
        try:
            with os.fdopen(fd, "wb") as f:
                async for chunk in chunks:
                    if not chunk:
                        continue
                    size += len(chunk)
                    if size > max_size:
                        raise TooLarge(
                            f"the upload exceeds the coordinator's limit of {max_size} bytes "
                            "(OVERTAKE_MAX_BLOB_SIZE); nothing was stored"
                        )
                    digest.update(chunk)
                    f.write(chunk)
            actual = digest.hexdigest()
            if actual != expected:
                raise Invalid(
                    f"the upload's sha256 is {actual} but {said_by} says {expected}; "
                    "the body was changed or cut in transit; nothing was stored, upload again"
                )
            return Staged(path, size, actual)
        except BaseException:
            path.unlink(missing_ok=True)
            raise


def _linked(path: Path, seen: dict[Path, bool] | None = None) -> bool:
    """Whether a directory on the way to `path` (under the store's root, which is resolved) is a symbolic link.
    Subtasks create the directories of a shared store themselves: a link there could point anywhere, and the
    coordinator must not read, count or delete objects outside the store through it. `seen`: answers for the
    directories asked about before in the same batch (a checkpoint's acks share one directory)."""
    parent = path.parent
    if seen is not None and parent in seen:
        return seen[parent]
    linked = os.path.realpath(parent) != str(parent)
    if seen is not None:
        seen[parent] = linked
    return linked


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


class FsspecBlobStore(_Base):
    """Any fsspec filesystem (gs://, az://, memory://...): state goes through the coordinator (no write targets,
    no read URLs)."""

    def __init__(self, url: str, staging_dir: Path, **options) -> None:
        import fsspec

        self.url = url
        self.fs, self.root = fsspec.core.url_to_fs(url, **options)
        self.root = self.root.rstrip("/")
        self.staging_dir = staging_dir

    def _path(self, key: str) -> str:
        return f"{self.root}/{_check_key(key)}"

    async def commit(self, staged: Staged, key: str) -> None:
        await asyncio.to_thread(self.fs.put_file, str(staged.path), self._path(key))
        staged.discard()

    def _size(self, path: str) -> int | None:
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            return None
        return int(info["size"]) if info.get("type") == "file" else None

    async def size(self, key: str) -> int | None:
        path = self._path(key)
        if not getattr(self.fs, "async_impl", False):
            return await asyncio.to_thread(self._size, path)
        # an async filesystem (s3fs): run its own coroutine on its I/O loop, so many HEADs can be in flight at once
        # without holding a worker thread each
        done = asyncio.run_coroutine_threadsafe(self.fs._info(path), self.fs.loop)
        try:
            info = await asyncio.wrap_future(done)
        except FileNotFoundError:
            return None
        return int(info["size"]) if info.get("type") == "file" else None

    async def read_range(self, key: str, start: int, end: int) -> AsyncIterator[bytes]:
        data = await asyncio.to_thread(self.fs.cat_file, self._path(key), start, end + 1)
        yield data

    async def sha256(self, key: str, start: int = 0, length: int | None = None) -> str | None:
        return await asyncio.to_thread(_digest, self.fs.open, self._path(key), start, length)

    async def delete(self, key: str) -> None:
        try:
            await asyncio.to_thread(self.fs.rm_file, self._path(key))
        except FileNotFoundError:
            pass

    def _find(self, prefix: str) -> list[str]:
        """Keys (relative to the root) of every object under a prefix."""
        base = f"{self.root}/{_check_prefix(prefix)}"
        try:
            found = self.fs.find(base)
        except FileNotFoundError:
            return []
        return [path[len(self.root) + 1 :] for path in found if path.startswith(base)]

    def _rm(self, keys: list[str]) -> None:
        if not keys:
            return
        try:
            self.fs.rm([f"{self.root}/{k}" for k in keys])
        except FileNotFoundError:
            pass

    async def delete_prefix(self, prefix: str) -> None:
        await self.prune(prefix, set())

    async def prune(self, prefix: str, keep: set[str]) -> list[str]:
        def run() -> list[str]:
            doomed = [k for k in self._find(prefix) if k not in keep]
            self._rm(doomed)
            return doomed

        return await asyncio.to_thread(run)

    async def write_target(self, prefix: str, expires_at: int, max_size: int) -> WriteTarget | None:
        return None

    async def read_urls(self, keys: Iterable[str], expires_in: int) -> dict[str, str]:
        return {}

    async def check(self) -> None:
        await asyncio.to_thread(self.fs.ls, self.root or "/")

    async def read_marker(self) -> bytes | None:
        def read() -> bytes | None:
            path = f"{self.root}/{MARKER}"
            try:
                info = self.fs.info(path)
                # an object larger than any marker is none of Overtake's (read as such, not read whole)
                return self.fs.cat_file(path) if int(info.get("size") or 0) <= MARKER_MAX else b""
            except FileNotFoundError:
                return None

        return await asyncio.to_thread(read)

    async def write_marker(self, data: bytes) -> None:
        await asyncio.to_thread(self.fs.pipe_file, f"{self.root}/{MARKER}", data)


class S3BlobStore(FsspecBlobStore):
    """s3://bucket/prefix through s3fs; subtasks write with presigned POSTs scoped to their checkpoint's prefix and
    read with presigned GETs, so the runtime never holds credentials.

    The endpoint, region and credentials are s3fs's and boto3's own: the standard AWS variables
    (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``/``AWS_DEFAULT_REGION``,
    ``AWS_ENDPOINT_URL``/``AWS_ENDPOINT_URL_S3``, ``AWS_PROFILE``), or fsspec's configuration (``FSSPEC_S3_*``
    variables such as ``FSSPEC_S3_ENDPOINT_URL``, ``FSSPEC_S3_KEY``, ``FSSPEC_S3_SECRET``); the presigner takes
    what s3fs was given, so both always talk to the same endpoint as the same principal.
    """

    presigned = True

    def __init__(self, url: str, staging_dir: Path) -> None:
        # no listings cache: whether an object exists must be asked of the store each time
        super().__init__(url, staging_dir, use_listings_cache=False)
        self.bucket, _, rest = self.root.partition("/")
        self.base = f"{rest}/" if rest else ""  # the store's root inside the bucket
        self._client = None

    def _presigner(self):
        if self._client is None:
            import boto3
            from botocore.config import Config

            fs = self.fs
            kwargs = dict(fs.client_kwargs)
            if fs.endpoint_url:
                kwargs["endpoint_url"] = fs.endpoint_url
            if fs.key:
                kwargs.update(aws_access_key_id=fs.key, aws_secret_access_key=fs.secret, aws_session_token=fs.token)
            config = Config(**{"signature_version": "s3v4", **fs.config_kwargs})
            self._client = boto3.session.Session().client("s3", config=config, **kwargs)
        return self._client

    def object_key(self, key: str) -> str:
        """The key inside the bucket."""
        return self.base + _check_key(key)

    def presigned_post(self, prefix: str, expires_in: int, max_size: int) -> dict:
        """A presigned POST whose policy allows keys under the prefix only, of at most `max_size` bytes."""
        start = self.base + _check_prefix(prefix)
        return self._presigner().generate_presigned_post(
            self.bucket,
            start + "${filename}",
            Conditions=[["starts-with", "$key", start], ["content-length-range", 0, max_size]],
            ExpiresIn=expires_in,
        )

    def _find(self, prefix: str) -> list[str]:
        """Keys (relative to the root) of every object under a prefix, as S3 lists them. s3fs's own listing takes
        an object whose key ends in '/' (the prefix itself, or ``name/``: a POST may name one) for a directory and
        leaves it out, so cleaning by prefix would never delete it."""
        start = self.base + _check_prefix(prefix)
        keys: list[str] = []
        for page in self._presigner().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start):
            keys += [o["Key"][len(self.base) :] for o in page.get("Contents", [])]
        return keys

    def _rm(self, keys: list[str]) -> None:
        """Delete these objects, 1000 per request; raises when S3 refused any of them (s3fs's bulk delete drops
        those refusals), so the sweep tries again."""
        client = self._presigner()
        for i in range(0, len(keys), 1000):
            objects = [{"Key": self.base + k} for k in keys[i : i + 1000]]
            answer = client.delete_objects(Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True})
            errors = answer.get("Errors") or []
            if errors:
                first = errors[0]
                raise OSError(
                    f"the S3 store refused to delete {len(errors)} object(s), e.g. {first.get('Key')!r}: "
                    f"{first.get('Code')} {first.get('Message')}"
                )

    async def write_target(self, prefix: str, expires_at: int, max_size: int) -> WriteTarget | None:
        expires_in = max(1, -(-(expires_at - int(time.time() * 1000)) // 1000))
        post = await asyncio.to_thread(self.presigned_post, prefix, expires_in, max_size)
        return WriteTarget(prefix=prefix, url=post["url"], fields=post["fields"], expires_at=expires_at)

    async def read_urls(self, keys: Iterable[str], expires_in: int) -> dict[str, str]:
        wanted = [_check_key(k) for k in keys]

        def sign() -> dict[str, str]:
            client = self._presigner()
            return {
                key: client.generate_presigned_url(
                    "get_object", Params={"Bucket": self.bucket, "Key": self.base + key}, ExpiresIn=expires_in
                )
                for key in wanted
            }

        return await asyncio.to_thread(sign)

    async def check(self) -> None:
        await asyncio.to_thread(self.fs.info, self.bucket)


BLOB_STORES: SchemeRegistry[BlobStore] = SchemeRegistry(
    "blob store", "OVERTAKE_BLOB_URL", "file:///var/lib/overtake/blobs or s3://bucket/prefix"
)
BLOB_STORES.register("file", lambda url, data_dir: FileBlobStore(url))
BLOB_STORES.register("s3", lambda url, data_dir: S3BlobStore(url, staging_dir=Path(data_dir).resolve() / "staging"))
for _scheme in ("gs", "gcs", "az", "abfs", "memory"):  # fsspec's other object stores (and its in-memory one)
    BLOB_STORES.register(
        _scheme, lambda url, data_dir: FsspecBlobStore(url, staging_dir=Path(data_dir).resolve() / "staging")
    )


def blob_store_from_url(url: str, data_dir: Path) -> BlobStore:
    """The blob store for the URL's scheme, from the table of known blob-store schemes."""
    return BLOB_STORES.create(url, data_dir=data_dir)


class StoreTaken(Unavailable):
    """The blob store holds another deployment's checkpoints (`claim`): the coordinator does not start, and, had the
    store not answered at its start, writes and deletes nothing in it (503, naming both deployments)."""


async def claim(store: BlobStore, namespace: str) -> None:
    """Make sure the store holds this deployment's checkpoints only: its root's marker names `namespace`, or there
    is none yet and this deployment writes it. Raises :class:`StoreTaken` when it names another deployment.

    Two deployments (two databases) given one blob URL would share its prefixes: job and checkpoint ids start at 1
    in every database, so one deployment's `job-1/cp-…` is the other's too, and each would delete the other's
    checkpoints as it aborts and retires its own. Written, then read back: of two deployments claiming an empty
    store at once, the one whose marker was overwritten finds out."""
    import json

    current = await store.read_marker()
    if current is None:
        await store.write_marker(json.dumps({"namespace": namespace}).encode())
        current = await store.read_marker()
    try:
        owner = json.loads(current or b"")["namespace"]
    except (ValueError, KeyError, TypeError):
        owner = None
    if owner != namespace:
        where = f"{store.url.rstrip('/')}/{MARKER}"
        held = f"deployment {owner!r}" if owner else f"something else (its {MARKER} is not Overtake's)"
        raise StoreTaken(
            f"the blob store {store.url} holds the checkpoints of {held} ({where}), and this coordinator is "
            f"deployment {namespace!r} (OVERTAKE_NAMESPACE, by default derived from the database URL). Two "
            "deployments on one blob URL would delete each other's checkpoints (their job ids overlap): give this "
            "one a blob URL of its own (another prefix), or, if it is a replica of that deployment, give it the same "
            "OVERTAKE_NAMESPACE"
        )
