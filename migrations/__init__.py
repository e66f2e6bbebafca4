"""Alembic migrations of the coordinator's database; they run on PostgreSQL and SQLite."""
