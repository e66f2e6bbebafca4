"""What every blob store shares: the key layout under checkpoint prefixes (``job-<id>/cp-<id>/``), the checks that
no client-supplied name becomes a path unless it matches them, staging with sha256 and size, and the store
protocol."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from app.errors import Conflict, DomainError, Invalid, TooLarge, Unavailable
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
