"""Object stores through fsspec: any fsspec URL (state through the coordinator only), and s3:// with presigned
writes and reads scoped to a checkpoint's prefix."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

from app.blobstore.base import (
    MARKER,
    MARKER_MAX,
    Staged,
    _Base,
    _check_key,
    _check_prefix,
    _digest,
)
from contract.models import WriteTarget


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
