"""32-bit floats as the doubles their shortest text reads as. Spark writes a ``float``
with its own precision's shortest digits (``0.1``); widened to a double as it is stored,
it would be ``0.10000000149011612``. Arrow prints a float32 with its shortest digits, and
that text read back as a double is the value both encoders then write as Spark shows it.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa


def widened(table: pa.Table) -> pa.Table:
    """``table`` with every float32 (at any depth) the double of its shortest text."""
    for i, field in enumerate(table.schema):
        if not _has_float32(field.type):
            continue
        column = table.column(i)
        text = column.cast(_replaced(field.type, pa.string()))
        table = table.set_column(i, field.name, text.cast(_replaced(field.type, pa.float64())))
    return table


def _has_float32(kind: Any) -> bool:
    if pa.types.is_float32(kind):
        return True
    return any(_has_float32(kind.field(i).type) for i in range(kind.num_fields))


def _replaced(kind: Any, by: pa.DataType) -> Any:
    """``kind`` with each float32 in it replaced by ``by``."""
    if pa.types.is_float32(kind):
        return by
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(_replaced(f.type, by)) for f in kind])
    if pa.types.is_map(kind):
        return pa.map_(_replaced(kind.key_type, by), _replaced(kind.item_type, by))
    if pa.types.is_large_list(kind):
        return pa.large_list(kind.value_field.with_type(_replaced(kind.value_type, by)))
    if pa.types.is_list(kind):
        return pa.list_(kind.value_field.with_type(_replaced(kind.value_type, by)))
    return kind
