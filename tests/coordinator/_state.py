"""What a subtask does with the blob store in the tests: find its checkpoint's write target in the trigger event,
write one object through it (a file in the shared directory, or a presigned POST to the S3 server) and read a blob
back from a restore plan's location, as the runtime would."""

from __future__ import annotations

import hashlib
from pathlib import Path
from urllib.parse import unquote, urlparse

import httpx


async def target_of(api, job_id: int, cp_id: int) -> dict | None:
    """The write target of a checkpoint's trigger event."""
    for e in await api.events(job_id):
        if e["type"] == "checkpoint.triggered" and e["data"]["checkpoint_id"] == cp_id:
            return e["data"]["target"]
    raise AssertionError(f"no checkpoint.triggered event for checkpoint {cp_id} of job {job_id}")


def _file_path(url: str) -> Path:
    return Path(unquote(urlparse(url).path))


async def write_object(target: dict, name: str, data: bytes) -> str:
    """Write an object named `name` under the target's prefix; returns its key (what the ack names)."""
    key = target["prefix"] + name
    if target["url"].startswith("file:"):
        path = _file_path(target["url"] + key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return key
    fields = dict(target["fields"])
    fields["key"] = fields["key"].replace("${filename}", name)
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.post(target["url"], data=fields, files={"file": (name, data, "application/octet-stream")})
    assert r.status_code in (200, 201, 204), r.text
    return key


def written(key: str, operator: bytes, channel: bytes) -> dict:
    """The `written` field of an ack for an object holding `operator` then `channel` state."""
    return {
        "key": key,
        "size": len(operator) + len(channel),
        "operator_size": len(operator),
        "operator_sha256": hashlib.sha256(operator).hexdigest() if operator else None,
        "channel_sha256": hashlib.sha256(channel).hexdigest() if channel else None,
    }


async def read_location(location: dict, start: int = 0, length: int | None = None) -> bytes:
    """Bytes of a blob from its restore-plan location (`length` bytes from `start` within the blob)."""
    first = location["offset"] + start
    n = location["size"] - start if length is None else length
    if n == 0:
        return b""
    url = location["url"]
    if url.startswith("file:"):
        with open(_file_path(url), "rb") as f:
            f.seek(first)
            return f.read(n)
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.get(url, headers={"Range": f"bytes={first}-{first + n - 1}"})
    assert r.status_code == 206, r.text
    return r.content
