"""Typed settings of the coordinator, read from OVERTAKE_* environment variables."""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.blobstore import BLOB_STORES
from app.db.session import DATABASES
from app.events import EVENT_BUSES


class Settings(BaseSettings):
    """Everything the coordinator can be told. Defaults are the embedded, zero-setup ones."""

    model_config = SettingsConfigDict(env_prefix="OVERTAKE_", env_file=None, extra="ignore", enable_decoding=False)

    data_dir: Path = Field(
        default=Path(".overtake"), description="Where the embedded database and blobs live."
    )
    database_url: str | None = Field(
        default=None,
        description="sqlite+aiosqlite:///path or postgresql+asyncpg://user@host/db; default: SQLite in data_dir.",
    )
    blob_url: str | None = Field(
        default=None, description="file:///dir or s3://bucket/prefix; default: data_dir/blobs."
    )
    redis_url: str | None = Field(default=None, description="redis://host:port/db; events between replicas.")
    namespace: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.\-]{1,64}$",
        description="This deployment's identity on the event bus and in the blob store it claims; default: derived "
        "from the database URL, so replicas of one deployment share it and deployments sharing a Redis or a blob URL "
        "never mix.",
    )
    admin_token: str | None = Field(
        default=None, description="Bearer token for management routes; unset = open."
    )
    cors_origins: list[str] = Field(
        default_factory=list,
        description="Origins (scheme://host:port) whose pages may call the API from a browser (CORS); without "
        "auth, state-changing requests from any other origin are refused. JSON list or comma-separated.",
    )
    host: str = "127.0.0.1"
    port: int = 8321
    max_blob_size: int = Field(default=512 * 1024 * 1024, description="Largest accepted blob, bytes.")
    max_request_body: int = Field(
        default=8 * 1024 * 1024,
        description="Largest accepted request body other than an upload (JSON), bytes; larger ones get a 413.",
    )
    body_timeout: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="Seconds a request's body may go without a byte arriving: a client that stalls, or sends less "
        "than its Content-Length says, is answered 408 then, instead of holding its request open for good.",
    )
    db_retries: int = Field(
        default=4,
        ge=0,
        le=20,
        description="How often a request whose transaction failed transiently (deadlock, serialization failure, "
        "lost connection) runs again before it is answered 503 with Retry-After.",
    )
    db_timeout: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="Seconds a connection to PostgreSQL, or one statement, may take before it counts as a transient "
        "failure (a database that does not answer, behind a network partition, would otherwise hold its requests, "
        "the ack committer and the scheduler for as long as TCP keeps the connection).",
    )
    scheduler_tick: float = Field(
        default=0.05,
        description="Seconds a scheduler pass woken by an event waits for more events (never past a known deadline), "
        "and between retries of a deadline it could not act on; deadlines ahead (periodic triggers, timeouts) are "
        "kept to the millisecond.",
    )
    scheduler_enabled: bool = True
    ack_batch_max: int = Field(
        default=512, description="Most acks committed in one group-commit transaction."
    )
    event_retention: int = Field(default=20_000, description="Events kept per job for resuming streams.")
    checkpoint_history: int = Field(
        default=1_000,
        description="Checkpoints kept per job in the database, with their acks: one older than the job's newest by "
        "more is deleted once nothing needs it (never a pending one, a savepoint, one kept for restore, one whose "
        "objects are not cleaned yet or that a kept checkpoint references).",
    )
    state_writes: Literal["direct", "coordinator"] = Field(
        default="direct",
        description="direct: subtasks write their state straight into the blob store (every checkpoint's trigger "
        "event carries a write target scoped to its prefix) and ack handles; coordinator: for executors that "
        "cannot reach the store, no target is handed out and subtasks upload their state through the coordinator.",
    )
    verify_blobs_on_restore: Literal["stat", "sha256"] = Field(
        default="stat",
        description="How a restore plan checks a checkpoint's blobs: stat (each object exists with its size; the "
        "subtask verifies checksums as it reads) or sha256 (read and hash every blob: slow with large state).",
    )
    read_url_expiry: int = Field(
        default=3600,
        ge=60,
        le=7 * 24 * 3600,
        description="Seconds a presigned read URL in a restore plan works (s3:// stores).",
    )
    late_write_grace: float = Field(
        default=60.0,
        ge=0,
        le=24 * 3600,
        description="Seconds after a checkpoint's timeout at which its prefix is swept once more: objects a subtask "
        "wrote too late (after an abort) or never acked are collected then.",
    )
    running_grace: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        description="Seconds an attempt that waits for its subtasks to report running waits at most before its "
        "periodic checkpoints start anyway.",
    )
    auto_migrate: bool = Field(default=True, description="Upgrade the database schema at start-up.")
    log_level: str = "INFO"
    log_format: Literal["json", "text"] = Field(
        default="json",
        description="One format for every log line of the coordinator, uvicorn's included: json (one object a "
        "line, for log collectors) or text (for people).",
    )
    log_json: bool | None = Field(default=None, description="Older form of log_format: false means text.")
    db_pool_size: int = 10

    @property
    def effective_log_format(self) -> str:
        return "text" if self.log_json is False else self.log_format

    @property
    def max_upload_size(self) -> int:
        """The largest upload request: a subtask's two blobs and its ack (acks/with-state)."""
        return 2 * self.max_blob_size + self.max_request_body

    @field_validator(
        "max_blob_size", "max_request_body", "ack_batch_max", "event_retention", "checkpoint_history", "db_pool_size"
    )
    @classmethod
    def _positive(cls, v: int) -> int:
        if v <= 0:
            raise ValueError(f"must be positive, got {v}")
        return v

    @field_validator("verify_blobs_on_restore", mode="before")
    @classmethod
    def _verify_mode(cls, v):
        """The setting was a boolean once: true (hash every blob) is sha256, false is stat."""
        if isinstance(v, bool):
            return "sha256" if v else "stat"
        if isinstance(v, str) and v.strip().lower() in ("true", "1", "yes", "false", "0", "no"):
            return "sha256" if v.strip().lower() in ("true", "1", "yes") else "stat"
        return v

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _origins(cls, v):
        if isinstance(v, str):
            if v.strip().startswith("["):
                return json.loads(v)
            return [o.strip() for o in v.split(",") if o.strip()]
        return v

    @field_validator("scheduler_tick")
    @classmethod
    def _tick(cls, v: float) -> float:
        if not 0 < v <= 10:
            raise ValueError(f"scheduler_tick must be in (0, 10] seconds, got {v}")
        return v

    @model_validator(mode="after")
    def _urls(self) -> Settings:
        """Every backend URL names a scheme of its backend's table (the error lists the known ones)."""
        DATABASES.check(self.effective_database_url)
        BLOB_STORES.check(self.effective_blob_url)
        EVENT_BUSES.check(self.event_bus_url)
        return self

    @cached_property
    def effective_namespace(self) -> str:
        """The deployment's identity: set, or a digest of the database URL without its password (every replica
        of a deployment uses the same database, and two deployments never do)."""
        if self.namespace:
            return self.namespace
        url = make_url_safe(self.effective_database_url)
        return "db-" + hashlib.sha256(url.encode()).hexdigest()[:16]

    @cached_property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{(self.data_dir / 'overtake.db').resolve()}"

    @cached_property
    def effective_blob_url(self) -> str:
        if self.blob_url:
            return self.blob_url
        return (self.data_dir / "blobs").resolve().as_uri()

    @property
    def is_sqlite(self) -> bool:
        return self.effective_database_url.startswith("sqlite")

    @property
    def event_bus_url(self) -> str:
        return self.redis_url or "memory://"


def make_url_safe(url: str) -> str:
    """The URL without a password (user@host stays), lower-cased scheme and host: the same database, the same text.
    The user and the path (the database's name) keep their case: PostgreSQL tells them apart by it."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    creds, at, location = rest.rpartition("@")  # the last @: a password may hold any character
    user = f"{creds.split(':', 1)[0]}@" if at else ""
    host, slash, path = location.partition("/")
    return f"{scheme.lower()}://{user}{host.lower()}{slash}{path}"
