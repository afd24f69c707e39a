"""Alembic migrations of the PostgreSQL tables fanout owns.

fanout keeps its own bookkeeping in PostgreSQL (the append-mode progress table of the
``postgres`` sink) in a schema of its own, ``fanout`` by default, with its own Alembic version
table (``<schema>.alembic_version``), so it never touches the user's tables or the user's own
Alembic history. The Alembic environment ships inside this plugin's wheel as the package
:mod:`fanout_postgres.migrations` (its ``versions/`` are the one definition of those tables).

:func:`upgrade` is what ``fanout migrate --url URL`` (:mod:`fanout_postgres.cli`) and the
sink's ``open()`` run. It is
safe to call any number of times (at head it does nothing) and from several processes at
once: the whole upgrade runs in one transaction holding a transaction-level advisory lock
(:func:`lock_key`), so a second pipeline starting at the same moment waits, then finds the
schema at head.

SQLAlchemy and Alembic are imported lazily, so importing this module (and the plugin) stays
cheap; ``pip install fanout-postgres`` brings them.
"""

from __future__ import annotations

import functools
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fanout.errors import ConfigurationError, shell_word
from fanout_postgres.identifiers import quote
from fanout_postgres.options import dotted_schema

if TYPE_CHECKING:
    from sqlalchemy import Table
    from sqlalchemy.engine import Connection

DEFAULT_SCHEMA = "fanout"
"""The schema holding fanout's tables unless told otherwise."""

VERSION_TABLE = "alembic_version"
"""Alembic's version table, created inside fanout's schema (never ``public``)."""

ALEMBIC_LOCK = threading.RLock()
"""Held while Alembic runs migration scripts in this process: its ``op`` and ``context`` are
module-level proxies that each run installs and removes, so two runs in two threads (two
PostgreSQL sinks of one pipeline opening, or planning their first batch, in parallel) would
pull them from under each other (``'NoneType' object has no attribute 'get_context'``)."""

LOCK_CLASS = 0x66616E  # "fan": the first key of the two-key advisory lock
"""First key of the advisory lock serialising migrations (the second is per schema)."""

INSTALL_HINT = "PostgreSQL support needs SQLAlchemy 2 and Alembic: pip install fanout-postgres"


@dataclass(frozen=True)
class MigrationResult:
    """What :func:`upgrade` did: the revision before and after, in one schema."""

    schema: str
    before: str | None
    after: str | None

    @property
    def changed(self) -> bool:
        """Whether any revision was applied."""
        return self.before != self.after


def lock_key(schema: str) -> tuple[int, int]:
    """The two keys of ``pg_advisory_xact_lock`` taken while migrating ``schema``."""
    second = zlib.crc32(schema.encode("utf-8"))
    return LOCK_CLASS, second - (1 << 32) if second >= 1 << 31 else second


def script_location() -> str:
    """The directory of the Alembic environment (package :mod:`fanout_postgres.migrations`)."""
    location = Path(__file__).resolve().parent / "migrations"
    if (location / "env.py").is_file():
        return str(location)
    raise ConfigurationError(
        "fanout's migrations are missing from this installation "
        "(package fanout_postgres.migrations); reinstall fanout-postgres"
    )


def _alembic_config(schema: str, connection: Any = None) -> Any:
    try:
        from alembic.config import Config
    except ImportError as exc:
        raise ConfigurationError(INSTALL_HINT) from exc
    location = script_location()
    config = Config()
    config.set_main_option("script_location", location)
    config.attributes["schema"] = schema
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision shipped with this version of fanout."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config(DEFAULT_SCHEMA)).get_current_head()
    assert head is not None
    return head


def ahead_of_code(current: str | None, schema: str) -> str | None:
    """What to do when fanout's tables in ``schema`` are at ``current``, a revision this
    version of fanout-postgres does not ship (a newer fanout migrated them): migrating
    cannot help, upgrading the plugin does. ``None`` for a revision it ships, or none."""
    from alembic.script import ScriptDirectory

    if current is None:
        return None
    script = ScriptDirectory.from_config(_alembic_config(DEFAULT_SCHEMA))
    if current in {r.revision for r in script.walk_revisions()}:
        return None
    return (
        f"fanout's tables in schema {schema!r} are at revision {current}, which this "
        f"fanout-postgres does not know (its newest is {head_revision()}): a newer fanout "
        "migrated them. Upgrade fanout-postgres to the version that did (`pip install -U "
        "fanout-postgres`); migrating again cannot help, and fanout never migrates down"
    )


def head_table(name: str, schema: str = DEFAULT_SCHEMA) -> Table:
    """fanout's table ``name`` in ``schema`` as the migrations leave it at head.

    The revisions under ``migrations/versions`` are the one definition of fanout's tables:
    this replays their ``upgrade()`` through Alembic, offline, into SQLAlchemy ``Table``
    objects instead of DDL (no database is touched). The statements the sink runs are built
    from these tables, so a column added by a new revision is known to them at once.
    """
    tables = _head_tables(schema)
    if name not in tables:
        raise ConfigurationError(f"fanout's migrations define no table {name!r}")
    return tables[name]


@functools.cache
def _head_tables(schema: str) -> dict[str, Table]:
    with ALEMBIC_LOCK:
        return _replay_head_tables(schema)


def _replay_head_tables(schema: str) -> dict[str, Table]:
    import io

    from alembic.ddl.postgresql import PostgresqlImpl
    from alembic.operations import Operations
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from sqlalchemy import Column

    tables: dict[str, Table] = {}

    class Replay(PostgresqlImpl):
        """Alembic's DDL implementation turned recorder: tables instead of statements."""

        def create_table(self, table: Table, **kw: Any) -> None:
            tables[table.name] = table

        def add_column(self, table_name: str, column: Any, **kw: Any) -> None:
            default = column.server_default
            tables[table_name].append_column(
                Column(
                    column.name,
                    column.type,
                    nullable=column.nullable,
                    server_default=default.arg if default is not None else None,
                    comment=column.comment,
                )
            )

        def _exec(self, construct: Any, *args: Any, **kw: Any) -> Any:
            raise NotImplementedError(
                "fanout's migrations are replayed into tables from create_table and "
                f"add_column only; teach head_table another operation: {construct}"
            )

    opts = {"as_sql": True, "output_buffer": io.StringIO(), "version_table_schema": schema}
    context = MigrationContext.configure(dialect_name="postgresql", opts=opts)
    context.impl = Replay(context.dialect, None, True, False, io.StringIO(), {})
    script = ScriptDirectory.from_config(_alembic_config(schema))
    with Operations.context(context):
        for revision in reversed(list(script.walk_revisions("base", "heads"))):
            revision.module.upgrade()
    return tables


def current_revision(connection: Connection, schema: str = DEFAULT_SCHEMA) -> str | None:
    """The revision ``schema`` is at, or ``None`` when fanout's tables were never created."""
    from sqlalchemy import inspect, text

    if not inspect(connection).has_table(VERSION_TABLE, schema=schema):
        return None
    version = connection.execute(
        text(f"SELECT version_num FROM {_quoted(connection, schema)}.{VERSION_TABLE}")
    ).scalar()
    return None if version is None else str(version)


def prepare_schema(connection: Connection, schema: str) -> None:
    """Take the migration lock for ``schema`` (until the transaction ends) and create the
    schema when missing. Called inside the transaction the migrations run in."""
    from sqlalchemy import func, inspect, select
    from sqlalchemy.schema import CreateSchema

    classid, objid = lock_key(schema)
    connection.execute(select(func.pg_advisory_xact_lock(classid, objid)))
    if schema not in inspect(connection).get_schema_names():
        connection.execute(CreateSchema(schema))


def upgrade(
    target: Any,
    *,
    schema: str = DEFAULT_SCHEMA,
    revision: str = "head",
    named: str = "option state_schema",
) -> MigrationResult:
    """Bring fanout's tables in ``schema`` up to ``revision``; a no-op when already there.

    :param target: a SQLAlchemy URL (string or ``URL``) or an ``Engine``.
    :param schema: the schema holding fanout's tables (created when missing).
    :param named: how a refusal names the schema's setting (``--schema`` for the command).
    :raises ConfigurationError: when SQLAlchemy or Alembic is not installed.
    """
    try:
        from alembic import command
        from sqlalchemy import create_engine
        from sqlalchemy.engine import Engine
        from sqlalchemy.pool import NullPool
    except ImportError as exc:
        raise ConfigurationError(INSTALL_HINT) from exc
    if not schema or "\x00" in schema:
        raise ConfigurationError(f"invalid schema name for fanout's tables: {schema!r}")
    if "." in schema:
        raise ConfigurationError(dotted_schema(schema, "the schema for fanout's tables"))
    if not isinstance(target, Engine):
        from sqlalchemy.engine import make_url

        from fanout_postgres.url import refuse_at_in_host

        try:  # an '@' to escape, not a host that cannot be found
            refuse_at_in_host(make_url(target), "the URL")
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
    engine = target if isinstance(target, Engine) else create_engine(target, poolclass=NullPool)
    try:
        with engine.connect() as conn, conn.begin():
            problem = state_schema_problem(conn, schema, creates=True, named=named)
            if problem is not None:
                raise ConfigurationError(problem)
            prepare_schema(conn, schema)  # serialises concurrent upgrades until COMMIT
            before = current_revision(conn, schema)
            ahead = ahead_of_code(before, schema)
            if ahead is not None:
                raise ConfigurationError(ahead)
            with ALEMBIC_LOCK:
                command.upgrade(_alembic_config(schema, conn), revision)
            after = current_revision(conn, schema)
    finally:
        if engine is not target:
            engine.dispose()
    return MigrationResult(schema, before, after)


def _quoted(connection: Connection, name: str) -> str:
    return str(connection.dialect.identifier_preparer.quote(name))


def state_schema_problem(
    connection: Connection, schema: str, *, creates: bool, named: str = "option state_schema"
) -> str | None:
    """Why the connection's role cannot keep fanout's tables in ``schema``, with the GRANT
    that lets it, or ``None``: the schema exists and the role may not use it, or may not
    read and write fanout's tables there (``SELECT`` on the version table, ``SELECT,
    INSERT, UPDATE, DELETE`` on the others, those present); or, when ``creates`` (option
    ``migrate``), it holds no version table yet and the role may not create tables in it,
    or it is missing and the role may not create schemas in the database. ``named``: how
    the message names the schema's setting. One query. Without this check ``fanout
    validate`` called such a sink valid, and ``fanout run`` and ``fanout migrate`` failed
    with PostgreSQL's "permission denied" alone."""
    from sqlalchemy import bindparam, text

    role, database, present, usable, creatable, unwritable, fillable = connection.execute(
        text(
            "SELECT current_user, current_database(), n.oid IS NOT NULL, "
            "n.oid IS NOT NULL AND has_schema_privilege(n.oid, 'USAGE'), "
            "has_database_privilege(current_database(), 'CREATE'), "
            "ARRAY(SELECT c.relname::text FROM pg_class c WHERE c.relnamespace = n.oid "
            "AND c.relkind IN ('r', 'p') AND c.relname IN :tables "
            "AND NOT (has_table_privilege(c.oid, 'SELECT') AND (c.relname = :version OR "
            "(has_table_privilege(c.oid, 'INSERT') AND has_table_privilege(c.oid, 'UPDATE') "
            "AND has_table_privilege(c.oid, 'DELETE')))) ORDER BY c.relname), "
            "n.oid IS NULL OR has_schema_privilege(n.oid, 'CREATE') OR EXISTS (SELECT FROM "
            "pg_class v WHERE v.relnamespace = n.oid AND v.relname = :version) "
            "FROM (SELECT to_regnamespace(quote_ident(:schema)) AS oid) AS n"
        ).bindparams(bindparam("tables", expanding=True)),
        {"schema": schema, "version": VERSION_TABLE, "tables": _state_tables(schema)},
    ).one()
    tables_grant = (
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {quote(schema)} TO "
        f"{quote(role)}"
    )
    if present and not usable:
        return (
            f"role {role!r} may not use schema {schema!r}, which holds fanout's state tables "
            f"({named}); grant it (GRANT USAGE ON SCHEMA {quote(schema)} TO "
            f"{quote(role)}; {tables_grant}), or name a schema it owns in {named}"
        )
    if present and unwritable:
        return (
            f"role {role!r} may not read and write fanout's state tables "
            f"{', '.join(f'{schema}.{t}' for t in unwritable)} ({named}); grant it "
            f"({tables_grant}), or name a schema it owns in {named}"
        )
    if present and creates and not fillable:
        return (
            f"role {role!r} may not create fanout's state tables in schema {schema!r} "
            f"({named}), which holds none yet; grant it (GRANT CREATE ON SCHEMA "
            f"{quote(schema)} TO {quote(role)}), or name a schema the role owns in {named}"
        )
    if not present and creates and not creatable:
        return (
            f"role {role!r} may not create schema {schema!r} for fanout's state tables "
            f"({named}) in database {database!r}; grant it (GRANT CREATE ON "
            f"DATABASE {quote(database)} TO {quote(role)}), or create the schema for it "
            f"(CREATE SCHEMA {quote(schema)} AUTHORIZATION {quote(role)})"
        )
    return None


def _state_tables(schema: str) -> list[str]:
    """fanout's tables in ``schema`` at head and the version table."""
    return [*_head_tables(schema), VERSION_TABLE]


def migration_problem(
    engine: Any, schema: str, shown_url: str, *, read_only: bool = False
) -> str | None:
    """What is wrong when fanout's tables in ``schema`` are not at the head revision (the
    sink needs them: append's progress marks, upsert's routes): the revision, the tables
    and columns missing, and the command that migrates; ``None`` when they are.

    :param read_only: said to a read-only check (``fanout recover``, ``fanout validate``),
        which migrates nothing whatever ``migrate`` says: the command only, not the option.
    """
    with engine.connect() as conn:
        current = current_revision(conn, schema)
        if current == head_revision():
            return None
        ahead = ahead_of_code(current, schema)
        if ahead is not None:
            return ahead
        missing = missing_at_head(conn, schema)
    what = f" (missing: {', '.join(missing)})" if missing else ""
    command = f"`fanout migrate --url {shell_word(shown_url)} --schema {shell_word(schema)}`"
    way = (
        f"the database needs {command} first (a read-only check migrates nothing)"
        if read_only
        else f"run {command} or set migrate: true"
    )
    return (
        f"fanout's tables in schema {schema!r} are at revision {current or '(none)'}, not "
        f"{head_revision()}{what}; {way}"
    )


def missing_at_head(connection: Connection, schema: str) -> list[str]:
    """The tables (``table <schema>.<name>``) and columns (``column <schema>.<table>.<name>``)
    of fanout's tables at head that ``schema`` lacks, in the migrations' order."""
    from sqlalchemy import inspect

    inspector = inspect(connection)
    missing: list[str] = []
    for name, table in _head_tables(schema).items():
        if not inspector.has_table(name, schema=schema):
            missing.append(f"table {schema}.{name}")
            continue
        present = {c["name"] for c in inspector.get_columns(name, schema=schema)}
        missing += [f"column {schema}.{name}.{c.name}" for c in table.columns
                    if c.name not in present]  # fmt: skip
    return missing
