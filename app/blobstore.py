"""The blob store for operator and channel state, chosen by URL: file:// (local directory) or any fsspec URL (s3://).

Keys are built by the server from ids it issued (`job-<id>/<blob id>`); no client-supplied name
ever becomes a path. Uploads are streamed to a staging file while their sha256 and size are
computed; only a verified upload is moved into place.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from app.errors import Invalid, TooLarge

KEY_RE = re.compile(r"^job-[0-9]+/[0-9a-f]{32}$")
CHUNK = 1024 * 1024


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


def _digest(opener, path) -> str | None:
    """sha256 of a stored blob, read in chunks; None if it is missing."""
    try:
        h = hashlib.sha256()
        with opener(path, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        return h.hexdigest()
    except FileNotFoundError:
        return None


def _durable_move(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
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
    key = f"job-{int(job_id)}/{blob_id}"
    if not KEY_RE.match(key):
        raise Invalid(f"blob id {blob_id!r} is not a blob id issued by this coordinator")
    return key


class BlobStore(Protocol):
    url: str

    async def stage(self, chunks: AsyncIterator[bytes], expected_sha256: str, max_size: int) -> Staged: ...
    async def commit(self, staged: Staged, key: str) -> None: ...
    async def size(self, key: str) -> int | None: ...
    def read_range(self, key: str, start: int, end: int) -> AsyncIterator[bytes]: ...
    async def sha256(self, key: str) -> str | None: ...
    async def delete(self, key: str) -> None: ...
    async def check(self) -> None: ...


class _Base:
    """Staging is local for every backend: hash and size-check before anything reaches the store."""

    staging_dir: Path

    async def stage(self, chunks: AsyncIterator[bytes], expected_sha256: str, max_size: int) -> Staged:
        expected = expected_sha256.lower()
        if not re.fullmatch(r"[0-9a-f]{64}", expected):
            raise Invalid(
                f"X-Overtake-Sha256 {expected_sha256!r} is not a hex sha256 digest (64 hex characters)"
            )
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
                    f"the upload's sha256 is {actual} but X-Overtake-Sha256 says {expected}; "
                    "the body was changed or cut in transit; nothing was stored, upload again"
                )
            return Staged(path, size, actual)
        except BaseException:
            path.unlink(missing_ok=True)
            raise


class FileBlobStore(_Base):
    def __init__(self, url: str) -> None:
        self.url = url
        parsed = urlparse(url)
        self.root = Path(parsed.path).resolve()
        self.staging_dir = self.root / ".staging"

    def _path(self, key: str) -> Path:
        if not KEY_RE.match(key):
            raise Invalid(f"not a blob key: {key!r}")
        return self.root / key

    async def commit(self, staged: Staged, key: str) -> None:
        # fsync the file, move it into place, fsync the directory: off the event loop, which serves the acks.
        await asyncio.to_thread(_durable_move, staged.path, self._path(key))

    async def size(self, key: str) -> int | None:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return None

    async def read_range(self, key: str, start: int, end: int) -> AsyncIterator[bytes]:
        with open(self._path(key), "rb") as f:
            f.seek(start)
            remaining = end - start + 1
            while remaining > 0:
                chunk = f.read(min(CHUNK, remaining))
                if not chunk:
                    break
                remaining -= len(chunk)
                yield chunk

    async def sha256(self, key: str) -> str | None:
        return await asyncio.to_thread(_digest, open, self._path(key))

    async def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    async def check(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if not os.access(self.root, os.W_OK):
            raise OSError(f"blob directory {self.root} is not writable")


class FsspecBlobStore(_Base):
    """Any fsspec filesystem (s3://bucket/prefix, memory://...)."""

    def __init__(self, url: str, staging_dir: Path) -> None:
        import fsspec

        self.url = url
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.staging_dir = staging_dir

    def _path(self, key: str) -> str:
        if not KEY_RE.match(key):
            raise Invalid(f"not a blob key: {key!r}")
        return f"{self.root.rstrip('/')}/{key}"

    async def commit(self, staged: Staged, key: str) -> None:
        await asyncio.to_thread(self.fs.put_file, str(staged.path), self._path(key))
        staged.discard()

    async def size(self, key: str) -> int | None:
        try:
            return int(await asyncio.to_thread(self.fs.size, self._path(key)))
        except FileNotFoundError:
            return None

    async def read_range(self, key: str, start: int, end: int) -> AsyncIterator[bytes]:
        data = await asyncio.to_thread(self.fs.cat_file, self._path(key), start, end + 1)
        yield data

    async def sha256(self, key: str) -> str | None:
        return await asyncio.to_thread(_digest, self.fs.open, self._path(key))

    async def delete(self, key: str) -> None:
        try:
            await asyncio.to_thread(self.fs.rm_file, self._path(key))
        except FileNotFoundError:
            pass

    async def check(self) -> None:
        await asyncio.to_thread(self.fs.ls, self.root.rstrip("/") or "/")


def blob_store_from_url(url: str, data_dir: Path) -> BlobStore:
    """Pick the blob store by the URL's scheme (file:// or any fsspec protocol such as s3://)."""
    scheme = urlparse(url).scheme
    if scheme == "file":
        return FileBlobStore(url)
    return FsspecBlobStore(url, staging_dir=Path(data_dir).resolve() / "staging")
