"""What :meth:`~fanout_postgres.sink.PostgresSink.open` checks beyond the options and the
table's shape: the session settings the server must take (and durability), names a
``search_path`` among them would resolve elsewhere, whether a missing table may be created
at the first write, the migration ``fanout validate`` would run, and what its own failure
to connect says.

Each check returns the problem as text (or ``None``), which the sink raises as its
configuration error naming itself and its table; nothing here writes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fanout_postgres.connections import NOT_DURABLE, not_durable
from fanout_postgres.identifiers import TableName, parse_table, quote

logger = logging.getLogger("fanout_postgres.sink")  # the sink's: its records keep that name

UNREACHABLE_HINT = (
    "check the host and port in option 'url', and that the server runs and accepts "
    "connections from this machine"
)
REFUSED_HINT = (
    "the server refused the connection: check the user, password and database in option "
    "'url' (a password from ${VAR} is read from the environment), and the server's "
    "pg_hba.conf"
)


def refused_login(error: BaseException) -> bool:
    """Whether ``error`` (or its driver error) is the server refusing the login: said with
    :data:`REFUSED_HINT`."""
    from fanout_postgres.sqlstate import refused_login

    cause = getattr(error, "orig", None) or error
    return refused_login(cause) and getattr(cause, "pgcode", None) is None


def settings_problem(
    conn: Any,
    sink: str,
    settings: Mapping[str, Any],
    tables: Sequence[TableName | None],
    *,
    transient: Callable[[BaseException], bool],
    clean: Callable[[BaseException], str],
) -> str | None:
    """Apply each of ``settings`` for one transaction, rolled back: a name or value the
    server refuses is the problem (an error ``transient`` calls so is raised as it is),
    as is ``synchronous_commit`` off, in the option or as the connection's effective value
    (set for the server, database or role). With a ``search_path`` among them, each of
    ``tables`` (the sink's table, a ``postgres:`` dead-letter table) named without a
    schema that it resolves elsewhere than the URL's search path does is logged
    (:func:`_warn_search_path`) for sink ``sink``. ``clean``: the error as said."""
    import sqlalchemy as sa

    path_set = any(str(name).lower() == "search_path" for name in settings)
    before = _schemas_named(conn, tables) if path_set else {}
    for name, value in settings.items():
        if str(name).lower() == "synchronous_commit" and str(value).lower() in NOT_DURABLE:
            return (
                f"option 'settings': synchronous_commit={value!r} lets a commit return "
                "before it is durable, so a server crash could lose rows the ledger "
                "records as written; leave it at the server's default (on)"
            )
        try:
            with conn.begin_nested():
                conn.execute(
                    sa.text("SELECT set_config(:name, :value, true)"),
                    {"name": str(name), "value": str(value)},
                )
        except Exception as exc:
            if transient(exc):
                raise
            return (
                f"option 'settings': the server refuses {name}={value!r}: "
                f"{clean(getattr(exc, 'orig', None) or exc)}"
            )
    effective = conn.execute(sa.text("SHOW synchronous_commit")).scalar()
    if str(effective).lower() in NOT_DURABLE:  # set for the server, database or role
        return not_durable(effective)
    if path_set:
        _warn_search_path(sink, before, _schemas_named(conn, tables))
    conn.rollback()
    return None


def _schemas_named(conn: Any, tables: Sequence[TableName | None]) -> dict[str, str | None]:
    """The schema each of ``tables`` named without one resolves to under ``conn``'s search
    path now: the one holding a table of that name first, else the one a ``CREATE TABLE``
    would make it in. One query each, at ``open()`` and only with a ``search_path`` in
    ``settings``."""
    import sqlalchemy as sa

    named = [t for t in tables if t is not None and t.schema is None]
    found: dict[str, str | None] = {}
    for table in named:
        found[table.quoted()] = conn.execute(
            sa.text(
                "SELECT COALESCE((SELECT n.nspname FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE c.oid = to_regclass(:table)), "
                "current_schema())"
            ),
            {"table": table.quoted()},
        ).scalar()
    return found


def _warn_search_path(
    sink: str, url_path: Mapping[str, str | None], settings_path: Mapping[str, str | None]
) -> None:
    """Log each table named without a schema that ``settings``' ``search_path`` would
    resolve elsewhere than the URL's: the sink writes where the URL's resolves (the
    driver's, qualified in every partition's statements); up to session 66 a
    ``postgres:`` dead-letter table found under ``settings``' path took the
    partitions' refused rows, and from then on the URL's table takes them."""
    for table, schema in url_path.items():
        other = settings_path.get(table)
        if schema is None or other is None or other == schema:
            continue
        logger.warning(
            "sink %r: option settings sets search_path, under which %s would be %s, but "
            "the sink writes %s (the URL's search path resolves it there; settings "
            "apply to the write connections only): name the schema in the option, or "
            "set the search path in the URL (?options=-csearch_path%%3D...)",
            sink, table, TableName(parse_table(table).name, other),
            TableName(parse_table(table).name, schema),
        )  # fmt: skip


def may_create_problem(conn: Any, table: TableName) -> str | None:
    """For a missing table ``create_table`` creates at the first write: why it could not
    be, its schema missing or the role not allowed to create tables there (what creating
    it at ``open()`` used to find out). One query."""
    import sqlalchemy as sa

    schema, role, allowed = conn.execute(
        sa.text(
            "SELECT s, current_user, CASE WHEN to_regnamespace(quote_ident(s)) IS NULL "
            "THEN NULL ELSE has_schema_privilege(s, 'CREATE') END "
            "FROM (SELECT coalesce(CAST(:schema AS text), current_schema()) AS s) AS t"
        ),
        {"schema": table.schema},
    ).one()
    if allowed is None:
        where = (
            "the search path names no schema that exists"
            if schema is None
            else f"schema {schema!r} does not exist"
        )
        return (
            f"create_table: {where}, so table {table} cannot be created at the first "
            "batch; create the schema, or the table"
        )
    if not allowed:
        return (
            f"create_table: role {role!r} may not create tables in schema {schema!r}, "
            f"so table {table} cannot be created at the first batch; grant it (GRANT "
            f"CREATE ON SCHEMA {quote(schema)} TO {quote(role)}), or create the table"
        )
    return None


def would_migrate(engine: Any, state_schema: str) -> str | None:
    """What ``open()`` with ``migrate: true`` would migrate (told to ``fanout validate``),
    ``None`` when fanout's tables in ``state_schema`` are at head."""
    from fanout_postgres.migrate import current_revision, head_revision

    with engine.connect() as conn:
        current = current_revision(conn, state_schema)
    if current != head_revision():
        return (
            f"migrate fanout's state tables in schema {state_schema!r} from revision "
            f"{current or '(none)'} to {head_revision()}"
        )
    return None
