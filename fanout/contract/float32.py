"""32-bit floats as the doubles their Spark text reads as. Spark writes a ``float``
with its own precision's shortest digits (``0.1``); widened to a double as it is stored,
it would be ``0.10000000149011612``. Arrow prints a float32 with its shortest digits, and
that text read back as a double is the value every JSON writer then spells as Spark shows
it (:mod:`fanout.contract.spark_json`): the Kafka sink's encoders, the dead letters
(:func:`fanout.contract.dead_letters.letter_rows`). pyarrow is imported here: import this
module inside the function that needs it.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from fanout.contract.nested_types import holds_arrow_type
from fanout.contract.spark_text import floating_text


def widened(table: pa.Table) -> pa.Table:
    """``table`` with every float32 (at any depth) the double of its Spark text."""
    for i, field in enumerate(table.schema):
        if not _has_float32(field.type):
            continue
        table = table.set_column(i, field.name, widened_array(table.column(i)))
    return table


_SMALLEST_NORMAL = 2.0**-126


def widened_array(array: Any) -> Any:
    """An Arrow array or chunked array with every float32 in it (at any depth) the double
    of its Spark text, as :func:`widened` does a table's columns."""
    if not _has_float32(array.type):
        return array
    if isinstance(array, pa.ChunkedArray):
        chunks = [_widened(chunk) for chunk in array.chunks]
        return pa.chunked_array(
            chunks, chunks[0].type if chunks else _replaced(array.type, pa.float64())
        )
    return _widened(array)


def _widened(array: Any) -> Any:
    """``array`` with each float32 in it the double of its Spark text: the double its
    shortest text reads as, but for a subnormal whose shortest text has one digit, which
    Java spells with the two closest to its exact value (``1e-45`` is ``1.4E-45``, which
    as a double is spelled ``1.4E-45``; the double ``1e-45`` would be ``1.0E-45``)."""
    kind = array.type
    if not _has_float32(kind):
        return array
    mask = array.is_null() if array.null_count else None
    if pa.types.is_float32(kind):
        text = array.cast(pa.string())
        magnitude = pc.abs(array)
        tiny = pc.fill_null(
            pc.and_(pc.less(magnitude, _SMALLEST_NORMAL), pc.not_equal(magnitude, 0)), False
        )
        if pc.any(tiny).as_py():
            java = floating_text(array.filter(tiny))
            text = pc.replace_with_mask(text, tiny, java)
        return text.cast(pa.float64())
    if pa.types.is_struct(kind):
        children = [_widened(array.field(i)) for i in range(kind.num_fields)]
        fields = [f.with_type(c.type) for f, c in zip(kind, children, strict=True)]
        return pa.StructArray.from_arrays(children, fields=fields, mask=mask)
    if pa.types.is_map(kind):
        keys, items = _widened(array.keys), _widened(array.items)
        widened_type = _replaced(kind, pa.float64())
        return pa.MapArray.from_arrays(array.offsets, keys, items, type=widened_type, mask=mask)
    # a list: its values, as the offsets of the slice name them
    values = _widened(array.values)
    list_type = pa.LargeListArray if pa.types.is_large_list(kind) else pa.ListArray
    field = kind.value_field.with_type(values.type)
    return list_type.from_arrays(array.offsets, values, type=_list_of(kind, field), mask=mask)


def _list_of(kind: Any, field: pa.Field) -> Any:
    return pa.large_list(field) if pa.types.is_large_list(kind) else pa.list_(field)


def _has_float32(kind: Any) -> bool:
    return holds_arrow_type(kind, pa.types.is_float32)


def _replaced(kind: Any, by: pa.DataType) -> Any:
    """``kind`` with each float32 in it replaced by ``by``."""
    if pa.types.is_float32(kind):
        return by
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(_replaced(f.type, by)) for f in kind])
    if pa.types.is_map(kind):
        key = kind.key_field.with_type(_replaced(kind.key_type, by))
        return pa.map_(key, kind.item_field.with_type(_replaced(kind.item_type, by)))
    if pa.types.is_large_list(kind):
        return pa.large_list(kind.value_field.with_type(_replaced(kind.value_type, by)))
    if pa.types.is_list(kind):
        return pa.list_(kind.value_field.with_type(_replaced(kind.value_type, by)))
    return kind
