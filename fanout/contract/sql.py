"""SQL text fanout writes inline: a string literal and a quoted identifier, as standard SQL
spells them (delta-rs's predicates, the spool's, and the statements an error prints for a
person to run, such as PostgreSQL's ``DELETE FROM ...``)."""

from __future__ import annotations


def sql_literal(value: str) -> str:
    """``value`` as a standard SQL string literal: in single quotes, each one in it doubled
    (``it's`` is ``'it''s'``)."""
    return "'" + value.replace("'", "''") + "'"


def sql_identifier(name: str) -> str:
    """``name`` as a standard SQL quoted identifier: in double quotes, each one in it
    doubled (``a"b`` is ``"a""b"``), always quoted."""
    return '"' + name.replace('"', '""') + '"'


__all__ = ["sql_identifier", "sql_literal"]
