"""Typed settings of the coordinator, read from OVERTAKE_* environment variables."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Everything the coordinator can be told. Defaults are the embedded, zero-setup ones."""

    model_config = SettingsConfigDict(env_prefix="OVERTAKE_", env_file=None, extra="ignore")

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
    admin_token: str | None = Field(
        default=None, description="Bearer token for management routes; unset = open."
    )
    host: str = "127.0.0.1"
    port: int = 8321
    max_blob_size: int = Field(default=512 * 1024 * 1024, description="Largest accepted upload, bytes.")
    scheduler_tick: float = Field(default=0.05, description="Seconds between scheduler passes.")
    scheduler_enabled: bool = True
    ack_batch_max: int = Field(
        default=512, description="Most acks committed in one group-commit transaction."
    )
    event_retention: int = Field(default=20_000, description="Events kept per job for resuming streams.")
    verify_blobs_on_restore: bool = True
    auto_migrate: bool = Field(default=True, description="Upgrade the database schema at start-up.")
    log_level: str = "INFO"
    log_json: bool = True
    db_pool_size: int = 10

    @field_validator("max_blob_size", "ack_batch_max", "event_retention", "db_pool_size")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v <= 0:
            raise ValueError(f"must be positive, got {v}")
        return v

    @field_validator("scheduler_tick")
    @classmethod
    def _tick(cls, v: float) -> float:
        if not 0 < v <= 10:
            raise ValueError(f"scheduler_tick must be in (0, 10] seconds, got {v}")
        return v

    @model_validator(mode="after")
    def _urls(self) -> Settings:
        db = self.effective_database_url
        if not (db.startswith("sqlite+aiosqlite://") or db.startswith("postgresql+asyncpg://")):
            raise ValueError(
                f"OVERTAKE_DATABASE_URL {db!r} is not supported: use sqlite+aiosqlite:///file.db "
                "or postgresql+asyncpg://user@host:port/db"
            )
        blob = self.effective_blob_url
        if "://" not in blob:
            raise ValueError(f"OVERTAKE_BLOB_URL {blob!r} needs a scheme: file:///dir or s3://bucket/prefix")
        if self.redis_url and not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"OVERTAKE_REDIS_URL {self.redis_url!r} must start with redis:// or rediss://")
        return self

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
