"""Text that is not UTF-8. A Spark string holds any bytes (``CAST(binary AS STRING)``,
a file read with another encoding), and Arrow hands them over unchecked: written as
they are, a JSON value, key or header would not be UTF-8 (and a JSON parser refuses the
whole record); turned into Python values, the row-by-row encoder failed the task with a
``UnicodeDecodeError`` naming nothing. Such a row is a bad record instead, naming the
column and the bytes (dead-lettered, or failing the batch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from fanout.contract.text import holds_invalid_utf8

_PREVIEW = 60


def rows_not_utf8(table: pa.Table, columns: Sequence[str]) -> tuple[pa.Array, list[str]] | None:
    """``None`` when the text of ``columns`` (at any depth) is UTF-8, else a mask of the
    rows where it is not, and those columns. One validation per column; row by row only
    when a column fails it."""
    mask: pa.Array | None = None
    found: list[str] = []
    for name in columns:
        column = table.column(name).combine_chunks()
        if not holds_invalid_utf8(column):
            continue
        flags = pa.array([holds_invalid_utf8(column.take([i])) for i in range(len(column))])
        mask = flags if mask is None else pc.or_(mask, flags)
        found.append(name)
    return None if mask is None else (mask, found)


def reasons(table: pa.Table, columns: Sequence[str]) -> list[str]:
    """Why each row of ``table`` (rows of :func:`rows_not_utf8`) is a bad record."""
    whys: list[list[str]] = [[] for _ in range(table.num_rows)]
    for name in columns:
        column = table.column(name).combine_chunks()
        text = _is_text(column.type)
        values = column.cast(pa.binary()).to_pylist() if text else [None] * len(column)
        for i, value in enumerate(values):
            if not holds_invalid_utf8(column.take([i])):
                continue
            if value is None:
                whys[i].append(f"column {name!r} holds text nested in it that is not UTF-8 "
                               "(left out of the letter's value)")  # fmt: skip
            else:
                shown = value[:_PREVIEW] + (b"..." if len(value) > _PREVIEW else b"")
                whys[i].append(f"column {name!r} holds text that is not UTF-8: {shown!r}")
    fix = (
        "fix the text in the query (e.g. decode() of its bytes in their encoding) or write "
        "the column as binary"
    )
    return [f"{'; '.join(why)}; {fix}" for why in whys]


def as_bytes(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """``table`` with the given columns' text as bytes (a top-level string: base64 in
    JSON) or, nested, as nulls: what a dead letter can hold of those rows."""
    for name in columns:
        i = table.column_names.index(name)
        column = table.column(i)
        if _is_text(column.type):
            table = table.set_column(i, name, column.cast(pa.binary()))
        else:
            table = table.set_column(i, name, pa.nulls(table.num_rows, column.type))
    return table


def _is_text(kind: Any) -> bool:
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind))
