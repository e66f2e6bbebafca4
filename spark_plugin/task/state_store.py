"""A subtask's side of the blob store: it writes its checkpoint state straight into the store (the coordinator only
gets the handle), and reads restored blobs back, verifying each against its sha256.

A checkpoint's write target comes with its trigger event (``CheckpointTriggered.target``): a ``file://`` directory
the executors share, or a presigned S3 POST scoped to the checkpoint's key prefix. One object per subtask per
checkpoint holds the operator state, then the channel state. A subtask that gets no target (the coordinator is
configured to take state through itself) uploads through the coordinator instead.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import unquote, urlparse

import httpx

from contract.models import BlobLocation, WriteTarget, WrittenState


class CorruptBlobError(RuntimeError):
    """A restored blob's bytes do not match its sha256: it is never replayed."""

    def __init__(self, blob_id: str, message: str) -> None:
        super().__init__(message)
        self.blob_id = blob_id


class StateTargets:
    """Each checkpoint's write target as its trigger event arrives (any thread); the ack worker waits for one."""

    def __init__(self) -> None:
        self._targets: dict[int, WriteTarget | None] = {}
        self._cond = threading.Condition()

    def put(self, checkpoint_id: int, target: WriteTarget | None) -> None:
        with self._cond:
            self._targets[checkpoint_id] = target
            # keep the recent ones only: a subtask takes checkpoints in order
            for old in [c for c in self._targets if c < checkpoint_id - 64]:
                del self._targets[old]
            self._cond.notify_all()

    def wait(self, checkpoint_id: int, timeout: float) -> tuple[bool, WriteTarget | None]:
        """``(known, target)``: whether the checkpoint's trigger was seen within ``timeout`` seconds, and its
        target (None: upload through the coordinator)."""
        with self._cond:
            self._cond.wait_for(lambda: checkpoint_id in self._targets, timeout)
            return checkpoint_id in self._targets, self._targets.get(checkpoint_id)


def _file_path(url: str) -> Path:
    parsed = urlparse(url)
    if parsed.scheme != "file":
        raise ValueError(f"not a file:// URL: {url!r}")
    return Path(unquote(parsed.path))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_dirs(directory: Path, root: Path | None) -> list[Path]:
    """Create ``directory`` and its missing parents (up to ``root``); returns those this call created, top first."""
    missing = []
    d = directory
    while not d.is_dir():
        missing.append(d)
        if d == root or d.parent == d:
            break
        d = d.parent
    created = []
    for d in reversed(missing):
        try:
            d.mkdir()
            created.append(d)
        except FileExistsError:
            pass  # another subtask made it: that one makes its entry durable before it acks
    return created


def _durable_write(path: Path, parts: tuple[bytes, ...], root: Path | None = None) -> None:
    """Write ``parts`` one after the other to ``path`` so that they survive a crash: the file fsynced, then its
    directory (the new entry), and the parent of every directory this write created (the checkpoint's directory is
    new, so its own entry must be durable). A directory another subtask created is that subtask's to make durable:
    it does so before it acks, and a checkpoint completes only once every subtask acked.

    The object is written in place, not into a temporary file renamed into place: its name belongs to one subtask,
    attempt and checkpoint, so nobody else writes it, and nobody reads it before the ack that names it, which is
    sent once it is durable and gives its size and sha256 (the coordinator checks the size, a restore the sha256).
    A first write cut short by a crash leaves an object that no ack names, deleted with its checkpoint's prefix. A
    write again goes over the object without truncating it first, then cuts it to its new size: the same state
    written again (a retried ack, whose first answer may have been lost after the ack counted) never makes the
    object anything but those bytes, even cut short; other bytes are written again only after the ack naming the
    first ones was refused. A rename after the file's fsync would be a second change of the directory, and its
    fsync a second journal commit."""
    created = _make_dirs(path.parent, root)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        views = [memoryview(p) for p in parts if p]
        size = sum(len(v) for v in views)
        while views:  # one writev, again for what a short write left
            n = os.writev(fd, views)
            while views and n >= len(views[0]):
                n -= len(views.pop(0))
            if views and n:
                views[0] = views[0][n:]
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_dir(path.parent)
    for d in reversed(created):
        if d.parent != d:
            _fsync_dir(d.parent)


HASH_ASIDE_BYTES = 256 << 10
"""State of at least this many bytes is hashed on the writer's own thread while the subtask writes it: hashing and
writing both release the GIL, so on a machine with a core to spare the sha256 (about 0.8 ms per MiB) takes nothing
from the write's time. Below this, handing the hash to the thread costs more than it saves."""


def _digests(op: bytes, ch: bytes) -> tuple[str | None, str | None]:
    return (hashlib.sha256(op).hexdigest() if op else None, hashlib.sha256(ch).hexdigest() if ch else None)


class StateWriter:
    """Writes one subtask's checkpoint state as one object under the checkpoint's prefix."""

    def __init__(self, name: str, http: httpx.Client | None = None) -> None:
        self.name = name
        """The object's name within a prefix: the subtask and its attempt, e.g. ``count-3-a2.state``."""
        self._http = http
        self._hasher: ThreadPoolExecutor | None = None

    def write(self, target: WriteTarget, operator_state: bytes | None, channel_state: bytes | None) -> WrittenState:
        op, ch = operator_state or b"", channel_state or b""
        key = target.prefix + self.name
        hashing = None
        if len(op) + len(ch) >= HASH_ASIDE_BYTES:
            if self._hasher is None:
                self._hasher = ThreadPoolExecutor(1, thread_name_prefix="overtake-state-hash")
            hashing = self._hasher.submit(_digests, op, ch)
        if target.url.startswith("file://"):
            root = _file_path(target.url)
            _durable_write(root / key, (op, ch), root)
        else:
            self._post(target, key, op + ch)
        operator_sha256, channel_sha256 = hashing.result() if hashing is not None else _digests(op, ch)
        return WrittenState(
            key=key,
            size=len(op) + len(ch),
            operator_size=len(op),
            operator_sha256=operator_sha256,
            channel_sha256=channel_sha256,
        )

    def _post(self, target: WriteTarget, key: str, data: bytes) -> None:
        """An S3 presigned POST: the policy's fields with this object's name in the key (``${filename}``, which the
        policy admits under the checkpoint's prefix only), then the object as the last part."""
        if self._http is None:
            self._http = httpx.Client(timeout=httpx.Timeout(30.0, connect=5.0))
        fields = dict(target.fields)
        fields["key"] = fields.get("key", key).replace("${filename}", self.name)
        response = self._http.post(target.url, data=fields, files={"file": (self.name, data)})
        if response.status_code >= 300:
            raise httpx.HTTPStatusError(
                f"writing {key} into the blob store was refused: HTTP {response.status_code} {response.text[:300]}",
                request=response.request,
                response=response,
            )

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
        if self._hasher is not None:
            self._hasher.shutdown(wait=False)
            self._hasher = None


class BlobReader:
    """Reads restored blobs from where the restore plan says they are, each once, verifying its sha256."""

    def __init__(self, locations: list[BlobLocation], through_coordinator, http: httpx.Client | None = None) -> None:
        self.locations = {loc.blob_id: loc for loc in locations}
        self.through_coordinator = through_coordinator
        """``(blob_id) -> bytes``: the whole blob from the coordinator (no location, or no URL)."""
        self._http = http
        self._cache: dict[str, bytes] = {}
        self.read_seconds = 0.0

    def blob(self, blob_id: str) -> bytes:
        if blob_id in self._cache:
            return self._cache[blob_id]
        t0 = time.perf_counter()
        loc = self.locations.get(blob_id)
        if loc is None or loc.url is None:
            data = self.through_coordinator(blob_id)
        elif loc.url.startswith("file://"):
            with open(_file_path(loc.url), "rb") as f:
                f.seek(loc.offset)
                data = f.read(loc.size)
        else:
            if self._http is None:
                self._http = httpx.Client(timeout=httpx.Timeout(60.0, connect=5.0))
            headers = {"Range": f"bytes={loc.offset}-{loc.offset + loc.size - 1}"} if loc.size else {}
            response = self._http.get(loc.url, headers=headers)
            response.raise_for_status()
            data = response.content
        self.read_seconds += time.perf_counter() - t0
        if loc is not None:
            actual = hashlib.sha256(data).hexdigest()
            if len(data) != loc.size or actual != loc.sha256:
                raise CorruptBlobError(
                    blob_id,
                    f"blob {blob_id} is corrupt: {len(data)} bytes with sha256 {actual}, expected {loc.size} bytes "
                    f"with sha256 {loc.sha256}",
                )
        self._cache[blob_id] = data
        return data

    def range(self, blob_id: str, start: int | None, end: int | None) -> bytes:
        """Bytes ``start..end`` (inclusive) of a blob, or all of it (the restore's ``FetchBlob``)."""
        data = self.blob(blob_id)
        if start is None:
            return data
        return data[start : (end + 1) if end is not None else None]

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
