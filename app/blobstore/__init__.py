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

import json
from pathlib import Path

from app.blobstore.base import (  # noqa: F401
    CHUNK,
    LEGACY_KEY_RE,
    MARKER,
    MARKER_MAX,
    PREFIX_RE,
    STATE_KEY_RE,
    BlobStore,
    Staged,
    _Base,
    _check_key,
    _check_prefix,
    _digest,
    _durable_move,
    blob_key,
    checkpoint_prefix,
    is_key,
    new_blob_id,
    store_answers,
    upload_key,
)
from app.blobstore.local import (  # noqa: F401
    LOCAL_FILESYSTEMS,
    FileBlobStore,
    _linked,
    _lstat_size,
    _lstat_sizes,
    _open_object,
    _prune_dir,
    _remove,
    _StatBatch,
    filesystem_type,
)
from app.blobstore.remote import (  # noqa: F401
    FsspecBlobStore,
    S3BlobStore,
)
from app.errors import Unavailable
from app.registry import SchemeRegistry

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
