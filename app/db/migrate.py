"""Schema migrations from code: `upgrade(settings)` runs Alembic to head (also what `overtake db upgrade` does)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations
from app.settings import Settings


def alembic_config(database_url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.set_main_option("sqlalchemy.url", database_url)
    return cfg


def upgrade(settings: Settings | None = None, revision: str = "head") -> None:
    settings = settings or Settings()
    command.upgrade(alembic_config(settings.effective_database_url), revision)


def downgrade(settings: Settings, revision: str) -> None:
    command.downgrade(alembic_config(settings.effective_database_url), revision)
