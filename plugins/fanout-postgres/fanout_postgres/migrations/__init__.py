"""Alembic environment for the PostgreSQL tables fanout owns (shipped in fanout-postgres).

Only fanout's own bookkeeping lives here (the append-mode progress table), in its own schema
(``fanout`` by default) with its own version table; nothing of the user's. Apply with
``fanout migrate --url URL`` or :func:`fanout_postgres.migrate.upgrade`.
"""
