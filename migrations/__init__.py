"""Alembic environment for the PostgreSQL tables fanout owns (shipped as ``fanout.migrations``).

Only fanout's own bookkeeping lives here (the append-mode progress table), in its own schema
(``fanout`` by default) with its own version table; nothing of the user's. Apply with
``fanout migrate --url URL`` or :func:`fanout.app.pg_migrations.upgrade`.
"""
