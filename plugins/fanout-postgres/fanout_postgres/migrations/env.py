"""Alembic's entry point for fanout's PostgreSQL schema.

Run through :func:`fanout_postgres.migrate.upgrade`, which hands over a connection already
inside a transaction holding the migration advisory lock (``config.attributes``). Run by
plain ``alembic -x url=... [-x schema=...]``, it takes the same lock itself.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool

from fanout_postgres.migrate import DEFAULT_SCHEMA, VERSION_TABLE, prepare_schema

config = context.config
x_args = context.get_x_argument(as_dictionary=True)
schema: str = config.attributes.get("schema") or x_args.get("schema") or DEFAULT_SCHEMA


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        version_table=VERSION_TABLE,
        version_table_schema=schema,
        transactional_ddl=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    """Emit the SQL instead of running it (``alembic upgrade head --sql``)."""
    context.configure(
        url=x_args.get("url") or config.get_main_option("sqlalchemy.url"),
        version_table=VERSION_TABLE,
        version_table_schema=schema,
        literal_binds=True,
        transactional_ddl=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    """Migrate through the given connection, or through a new one from ``-x url=``."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = x_args.get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("fanout migrations: give the database as -x url=postgresql://...")
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn, conn.begin():
            prepare_schema(conn, schema)
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
