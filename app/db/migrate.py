"""Schema migrations from code: `upgrade(database_url)` runs Alembic to head (also what `overtake db upgrade` does)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations


def alembic_config(database_url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.set_main_option("sqlalchemy.url", database_url)
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    command.downgrade(alembic_config(database_url), revision)
