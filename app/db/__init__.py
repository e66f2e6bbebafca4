"""Persistence: SQLAlchemy tables, the session context and migrations."""
