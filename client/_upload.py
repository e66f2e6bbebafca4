"""Blob upload bodies: hash the data first (the coordinator verifies ``X-Overtake-Sha256`` before storing
anything), then stream it in chunks, as many times as retries need.

Accepted data: ``bytes``-like, a file path, a binary file object (read twice; rewound when it can seek,
otherwise read into memory), or an iterable of ``bytes`` chunks (materialised once).
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from client._http import Body

CHUNK_SIZE = 1024 * 1024

BlobData = bytes | bytearray | memoryview | str | os.PathLike | IO[bytes] | Iterable[bytes]


@dataclass(frozen=True)
class PreparedBlob:
    sha256: str
    body: Body


def prepare_blob(data: BlobData, chunk_size: int = CHUNK_SIZE) -> PreparedBlob:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return _from_bytes(bytes(data), chunk_size)
    if isinstance(data, (str, os.PathLike)):
        return _from_path(Path(data), chunk_size)
    if hasattr(data, "read"):
        return _from_file(data, chunk_size)
    if isinstance(data, Iterable):
        chunks = []
        for chunk in data:
            if not isinstance(chunk, (bytes, bytearray, memoryview)):
                raise TypeError(f"blob chunks must be bytes, got {type(chunk).__name__}")
            chunks.append(bytes(chunk))
        return _from_chunks(chunks)
    raise TypeError(
        f"cannot upload a {type(data).__name__}: give bytes, a file path, a binary file object or an iterable of bytes"
    )


def _from_bytes(data: bytes, chunk_size: int) -> PreparedBlob:
    view = memoryview(data)

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(data), chunk_size):
            yield bytes(view[start : start + chunk_size])

    return PreparedBlob(hashlib.sha256(data).hexdigest(), Body(chunks, len(data)))


def _from_chunks(chunks: list[bytes]) -> PreparedBlob:
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return PreparedBlob(digest.hexdigest(), Body(lambda: iter(chunks), sum(len(c) for c in chunks)))


def _read_chunks(handle: IO[bytes], chunk_size: int) -> Iterator[bytes]:
    while True:
        chunk = handle.read(chunk_size)
        if not chunk:
            return
        if isinstance(chunk, str):
            raise TypeError("the file object must be opened in binary mode ('rb')")
        yield chunk


def _from_path(path: Path, chunk_size: int) -> PreparedBlob:
    if not path.is_file():
        raise FileNotFoundError(f"no file to upload at {str(path)!r}")
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        for chunk in _read_chunks(handle, chunk_size):
            digest.update(chunk)
            size += len(chunk)

    def chunks() -> Iterator[bytes]:
        with path.open("rb") as handle:
            yield from _read_chunks(handle, chunk_size)

    return PreparedBlob(digest.hexdigest(), Body(chunks, size, blocking=True))


def _from_file(handle: IO[bytes], chunk_size: int) -> PreparedBlob:
    seekable = getattr(handle, "seekable", lambda: False)()
    if not seekable:
        data = handle.read()
        if isinstance(data, str):
            raise TypeError("the file object must be opened in binary mode ('rb')")
        return _from_bytes(data, chunk_size)
    start = handle.tell()
    digest = hashlib.sha256()
    size = 0
    for chunk in _read_chunks(handle, chunk_size):
        digest.update(chunk)
        size += len(chunk)

    def chunks() -> Iterator[bytes]:
        handle.seek(start)
        yield from _read_chunks(handle, chunk_size)

    return PreparedBlob(digest.hexdigest(), Body(chunks, size, blocking=not isinstance(handle, io.BytesIO)))
