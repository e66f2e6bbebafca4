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
import uuid
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


def _durable_write(path: Path, data: bytes, root: Path | None = None) -> None:
    """Write ``data`` to ``path`` so that it survives a crash: a temporary file, fsynced, renamed into place, its
    directory fsynced, and the parent of every directory this write created fsynced too (the checkpoint's
    directory is new, so its own entry must be durable). A directory another subtask created is that subtask's to
    make durable: it does so before it acks, and a checkpoint completes only once every subtask acked."""
    created = _make_dirs(path.parent, root)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    for d in reversed(created):
        if d.parent != d:
            _fsync_dir(d.parent)


class StateWriter:
    """Writes one subtask's checkpoint state as one object under the checkpoint's prefix."""

    def __init__(self, name: str, http: httpx.Client | None = None) -> None:
        self.name = name
        """The object's name within a prefix: the subtask and its attempt, e.g. ``count-3-a2.state``."""
        self._http = http

    def write(self, target: WriteTarget, operator_state: bytes | None, channel_state: bytes | None) -> WrittenState:
        op, ch = operator_state or b"", channel_state or b""
        key = target.prefix + self.name
        data = op + ch
        if target.url.startswith("file://"):
            root = _file_path(target.url)
            _durable_write(root / key, data, root)
        else:
            self._post(target, key, data)
        return WrittenState(
            key=key,
            size=len(data),
            operator_size=len(op),
            operator_sha256=hashlib.sha256(op).hexdigest() if op else None,
            channel_sha256=hashlib.sha256(ch).hexdigest() if ch else None,
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
