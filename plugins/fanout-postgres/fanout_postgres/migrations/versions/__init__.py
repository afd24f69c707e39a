"""Alembic revisions of fanout's PostgreSQL schema, oldest first."""
