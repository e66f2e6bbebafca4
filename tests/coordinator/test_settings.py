"""Settings pick each backend by URL scheme from its table, and refuse an unknown scheme listing the known ones."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.blobstore import BLOB_STORES, FileBlobStore, blob_store_from_url
from app.db.session import DATABASES
from app.events import EVENT_BUSES, MemoryBus, event_bus_from_url
from app.settings import Settings


@pytest.mark.parametrize(
    ("field", "url", "known"),
    [
        ("database_url", "mysql://db/overtake", ["sqlite+aiosqlite://", "postgresql+asyncpg://"]),
        ("blob_url", "ftp://host/blobs", ["file://", "s3://"]),
        ("redis_url", "http://cache:6379", ["redis://", "rediss://"]),
    ],
)
def test_an_unknown_scheme_is_refused_naming_the_url_and_the_known_schemes(tmp_path, field, url, known):
    with pytest.raises(ValidationError) as info:
        Settings(data_dir=tmp_path, **{field: url})
    message = str(info.value)
    assert url in message and all(k in message for k in known)


def test_a_url_without_a_scheme_is_refused(tmp_path):
    with pytest.raises(ValidationError, match="without a scheme"):
        Settings(data_dir=tmp_path, blob_url="/var/lib/blobs")


def test_each_backend_is_built_from_its_table(tmp_path):
    assert {"sqlite+aiosqlite", "postgresql+asyncpg"} <= set(DATABASES.schemes)
    assert {"file", "s3"} <= set(BLOB_STORES.schemes)
    assert {"memory", "redis"} <= set(EVENT_BUSES.schemes)
    assert isinstance(blob_store_from_url((tmp_path / "b").as_uri(), tmp_path), FileBlobStore)
    bus = event_bus_from_url("memory://", "ns")
    assert isinstance(bus, MemoryBus) and bus.namespace == "ns"
