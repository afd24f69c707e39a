"""The target table as PostgreSQL's catalog has it now, for the PostgreSQL sink's write plan.

Read on the driver only: at :meth:`~fanout_postgres.sink.PostgresSink.open` and when a
batch is planned or its cached plan checked again (one catalog query each). The columns
and rules (:func:`shape`) decide whether a cached plan still fits the table; rules the
sink cannot honour refuse it (:func:`rules_problem`); :func:`resolved_schema` names the
schema a table named without one resolves to, which the statements then name.
"""

from __future__ import annotations

from typing import Any

from fanout_postgres.identifiers import TableName, quote

_UNIQUE_INDEXES = (
    "(SELECT string_agg(x.indkey::text || CASE WHEN x.indimmediate THEN '' ELSE ' deferrable' "
    "END || CASE WHEN x.indpred IS NULL AND x.indexprs IS NULL THEN '' ELSE ' partial' END, "
    "'; ' ORDER BY x.indkey::text) FROM pg_index x "
    "WHERE x.indrelid = to_regclass(:table) AND x.indisunique)"
)
"""The table's unique indexes (their column numbers): one dropped or added since a plan was
made makes the batch planned anew, so that upsert keys that lost theirs are refused."""
_WRITE_RULES = "ev_class = to_regclass(:table) AND ev_type IN ('2', '3')"
"""``pg_rewrite`` rows of the table's ``ON UPDATE`` (2) and ``ON INSERT`` (3) rules."""


def shape(conn: Any, table: TableName) -> list[tuple[Any, ...]]:
    """The table's columns as the catalog has them now: name, type, NOT NULL, and on each
    row the count of its ``ON INSERT``/``ON UPDATE`` rules (:func:`rules_problem`) and its
    unique indexes (:data:`_UNIQUE_INDEXES`: upsert keys must keep one)."""
    import sqlalchemy as sa

    rows = conn.execute(
        sa.text(
            "SELECT attname, format_type(atttypid, atttypmod), attnotnull, "
            f"(SELECT count(*) FROM pg_rewrite WHERE {_WRITE_RULES}), {_UNIQUE_INDEXES} "
            "FROM pg_attribute WHERE attrelid = to_regclass(:table) AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum"
        ),
        {"table": table.quoted()},
    )
    return [tuple(row) for row in rows]


def rules_problem(conn: Any, table: TableName) -> str | None:
    """Why a table with ``ON INSERT`` or ``ON UPDATE`` rules cannot be written: ``COPY``
    fires no rule while the ``INSERT`` a partition falls back to does, so whether a rule
    ran would depend on which path its rows took. ``None`` without such rules."""
    import sqlalchemy as sa

    rules = conn.execute(
        sa.text(
            "SELECT rulename, CASE ev_type WHEN '2' THEN 'UPDATE' ELSE 'INSERT' END "
            f"FROM pg_rewrite WHERE {_WRITE_RULES} ORDER BY rulename"
        ),
        {"table": table.quoted()},
    ).all()
    if not rules:
        return None
    named = ", ".join(f"{quote(name)} (ON {event})" for name, event in rules)
    return (
        f"the table has rule(s) {named}: the sink writes with COPY, which fires no rule, "
        "and falls back to INSERT, which does, so whether a rule ran would depend on the "
        "rows; replace the rule(s) with a trigger, which COPY fires too"
    )


def resolved_schema(conn: Any, table: TableName | None) -> str | None:
    """The schema ``table``, named without one, resolves to on the driver's connection (its
    URL's search path); ``None`` for a name with a schema, no table, or none found. One
    query, at a plan only."""
    if table is None or table.schema is not None:
        return None
    import sqlalchemy as sa

    found = conn.execute(
        sa.text(
            "SELECT n.nspname FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE c.oid = to_regclass(:table)"
        ),
        {"table": table.quoted()},
    ).scalar()
    return None if found is None else str(found)
