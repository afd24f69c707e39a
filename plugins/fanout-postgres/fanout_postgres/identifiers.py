"""Identifiers: table names from options, checks, and quoting through SQLAlchemy.

Names in options are taken literally (case-sensitive, never parsed as SQL): ``Orders`` is the
table ``"Orders"``, and ``Orders "2026"; drop table x`` is a table of that exact name. Every
identifier reaches SQL only through SQLAlchemy's PostgreSQL identifier preparer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAX_IDENTIFIER_BYTES = 63
"""PostgreSQL's NAMEDATALEN - 1; longer names would be truncated silently by the server."""


def check_identifier(name: Any, what: str) -> str:
    """``name`` when it is a usable PostgreSQL identifier, else ``ValueError`` saying why."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} must be a non-empty string, got {name!r}")
    if "\x00" in name:
        raise ValueError(f"{what} {name!r} contains a NUL character")
    if len(name.encode("utf-8")) > MAX_IDENTIFIER_BYTES:
        raise ValueError(
            f"{what} {name!r} is longer than {MAX_IDENTIFIER_BYTES} bytes; PostgreSQL would "
            "truncate it silently"
        )
    return name


@dataclass(frozen=True)
class TableName:
    """A table name with an optional schema (``None``: the connection's search path)."""

    name: str
    schema: str | None = None

    def quoted(self) -> str:
        """The name as SQL, every part quoted when needed (for messages and statements)."""
        return ".".join(quote(p) for p in (self.schema, self.name) if p is not None)

    def __str__(self) -> str:
        return self.quoted()


def parse_table(value: Any) -> TableName:
    """The option ``table``: ``"name"``, ``"schema.name"``, ``["schema", "name"]``.

    In the string form a part may be double-quoted (``"my.schema"."t"``, ``""`` for a
    quote) to hold a dot; an unquoted part is taken literally up to the first dot.
    """
    parts: Sequence[Any]
    if isinstance(value, (list, tuple)):
        parts = list(value)
    elif isinstance(value, str):
        parts = _split(value)
    else:
        raise ValueError(f"option 'table' must be a string or [schema, table], got {value!r}")
    if len(parts) == 1:
        return TableName(check_identifier(parts[0], "table name"))
    if len(parts) == 2:
        return TableName(
            check_identifier(parts[1], "table name"), check_identifier(parts[0], "schema name")
        )
    raise ValueError(f"option 'table' {value!r} has more than two parts (schema.table)")


def _split(text: str) -> list[str]:
    if not text.startswith('"') and text.count(".") == 0:
        return [text]
    parts: list[str] = []
    i = 0
    while i <= len(text):
        if text.startswith('"', i):
            j, buf = i + 1, []
            while True:
                k = text.find('"', j)
                if k < 0:
                    raise ValueError(f"option 'table' {text!r}: unterminated quote")
                buf.append(text[j:k])
                if text.startswith('"', k + 1):
                    buf.append('"')
                    j = k + 2
                    continue
                break
            parts.append("".join(buf))
            i = k + 1
            if i < len(text) and text[i] != ".":
                raise ValueError(f"option 'table' {text!r}: expected '.' after a quoted name")
        else:
            k = text.find(".", i)
            k = len(text) if k < 0 else k
            parts.append(text[i:k])
            i = k
        i += 1
    return parts


def quote(name: str) -> str:
    """One identifier quoted by SQLAlchemy's PostgreSQL dialect (only when needed)."""
    return str(_preparer().quote(name))


def quote_always(name: str) -> str:
    """One identifier, always double-quoted (embedded quotes doubled)."""
    return str(_preparer().quote_identifier(name))


_PREPARER: Any = None


def _preparer() -> Any:
    global _PREPARER
    if _PREPARER is None:
        from sqlalchemy.dialects import postgresql

        # paramstyle "named": no doubling of "%" (the statements quoted here run without
        # parameters, and messages show names as they are)
        _PREPARER = postgresql.dialect(paramstyle="named").identifier_preparer
    return _PREPARER
