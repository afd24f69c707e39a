"""Record keys and JSON values built column by column with Arrow compute.

Encoding row by row in Python (``to_pylist`` then ``json.dumps``) costs about 20 µs a row,
which made the Kafka sink the slowest part of a fan-out. Here each column becomes one
array of JSON fragments and Arrow joins them row-wise, for about a tenth of that.

The bytes are exactly those of the row-by-row path (:func:`fanout_kafka.values.json_bytes`
and :func:`fanout_kafka.records.to_bytes`): where Arrow formats a value differently
(floats in exponent form or without a fraction, strings needing escapes, years outside
1000-9999), that value is formatted by Python instead. Types without a column-wise form
(decimals, binary, nested, times, zoned timestamps other than UTC) return ``None``, and
the caller encodes the batch row by row.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from fanout_kafka.values import json_default

_UTC_ZONES = frozenset({"UTC", "Etc/UTC", "+00:00", "Z"})
# the years written column-wise (1000-9999), as microseconds and days since 1970
_FIRST_MICROS = -30_610_224_000_000_000  # 1000-01-01T00:00:00
_LAST_MICROS = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999
_FIRST_DAY = -354_285  # 1000-01-01
_LAST_DAY = 2_932_896  # 9999-12-31
_NEEDS_ESCAPE = r'["\\\x00-\x1f]'


def json_rows(table: pa.Table) -> pa.Array | None:
    """The JSON object of every row (``{"col":value,...}``, compact, UTF-8), or ``None``."""
    parts: list[Any] = []
    for i, name in enumerate(table.column_names):
        fragment = json_fragments(table.column(i))
        if fragment is None:
            return None
        head = ("{" if i == 0 else ",") + json.dumps(name, ensure_ascii=False) + ":"
        parts += [pa.scalar(head), fragment]
    if not parts:
        return pa.array([b"{}"] * table.num_rows, pa.binary())
    parts.append(pa.scalar("}"))
    return pc.binary_join_element_wise(*parts, pa.scalar("")).cast(pa.binary())


def json_arrays(table: pa.Table, columns: Sequence[str]) -> pa.Array | None:
    """``[v1,v2,...]`` of the given columns for every row (a multi-column key), or ``None``."""
    parts: list[Any] = []
    for i, name in enumerate(columns):
        fragment = json_fragments(table.column(name))
        if fragment is None:
            return None
        parts += [pa.scalar("[" if i == 0 else ","), fragment]
    parts.append(pa.scalar("]"))
    return pc.binary_join_element_wise(*parts, pa.scalar("")).cast(pa.binary())


def key_bytes(column: pa.ChunkedArray | pa.Array) -> pa.Array | None:
    """A single-column key as :func:`to_bytes` makes it (nulls stay null), or ``None``."""
    column = _whole(column)
    kind = column.type
    text = pa.types.is_string(kind) or pa.types.is_large_string(kind)
    if text or pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return column.cast(pa.binary())  # text as UTF-8, bytes as they are
    if pa.types.is_integer(kind):
        return column.cast(pa.string()).cast(pa.binary())
    return None


def json_fragments(column: pa.ChunkedArray | pa.Array) -> pa.Array | None:
    """Each value's JSON text (``null`` for nulls), or ``None`` for unsupported types."""
    column = _whole(column)
    kind = column.type
    if pa.types.is_null(kind):
        return pa.array(["null"] * len(column), pa.string())
    if pa.types.is_boolean(kind):
        text = pc.if_else(column, pa.scalar("true"), pa.scalar("false"))
    elif pa.types.is_integer(kind):
        text = column.cast(pa.string())
    elif pa.types.is_floating(kind) and not pa.types.is_float16(kind):
        text = _floats(column.cast(pa.float64()))
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = _strings(column.cast(pa.string()))
    elif pa.types.is_timestamp(kind) and kind.unit == "us" and _utc_or_naive(kind.tz):
        text = _timestamps(column, zoned=kind.tz is not None)
    elif pa.types.is_date32(kind):
        text = _dates(column)
    else:
        return None
    return text.fill_null("null")


def _whole(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _utc_or_naive(tz: str | None) -> bool:
    return tz is None or tz in _UTC_ZONES


def _python(
    column: pa.Array, good: pa.Array, text: pa.Array, fmt: Callable[[Any], str]
) -> pa.Array:
    """``text`` with the values where ``good`` is false formatted by Python's ``fmt``."""
    redo = pc.and_(pc.invert(good.fill_null(True)), column.is_valid())
    if not pc.any(redo).as_py():
        return text
    values = column.filter(redo).to_pylist()
    return pc.replace_with_mask(text, redo, pa.array([fmt(v) for v in values], pa.string()))


def _dumps(value: Any) -> str:
    return json.dumps(value, default=json_default, ensure_ascii=False)


def _floats(column: pa.Array) -> pa.Array:
    # Arrow and Python print the same shortest digits; they differ in when they switch to
    # exponent form and in Python's ".0" on integral values
    text = column.cast(pa.string())
    size = pc.abs(column)
    plain = pc.and_(pc.greater_equal(size, 1e-4), pc.less(size, 1e16))
    positional = pc.invert(pc.match_substring(text, "e"))
    fraction = pc.match_substring(text, ".")
    integral = pc.and_(plain, pc.and_(positional, pc.invert(fraction)))
    zero = pc.equal(column, 0.0)
    text = pc.if_else(pc.or_(integral, zero), pc.binary_join_element_wise(text, ".0", ""), text)
    good = pc.or_(zero, pc.and_(plain, positional))
    return _python(column, good, text, _dumps)


def _strings(column: pa.Array) -> pa.Array:
    text = pc.binary_join_element_wise('"', column, '"', "")
    good = pc.invert(pc.match_substring_regex(column, _NEEDS_ESCAPE))
    return _python(column, good, text, _dumps)


def _timestamps(column: pa.Array, *, zoned: bool) -> pa.Array:
    # Arrow prints a microsecond timestamp, its zone dropped (the UTC wall clock), as
    # "YYYY-MM-DD HH:MM:SS.ffffff"; Python's isoformat has "T" for the space and no zero
    # fraction. Editing that one text costs about half of formatting the seconds and the
    # fraction apart (and pc.year() of a zoned column converts every value). Years outside
    # 1000-9999 keep the row-by-row path, as before: Arrow 26 pads them as Python does,
    # but no other version was checked.
    text = column.cast(pa.timestamp("us")).cast(pa.string())
    stamp = pc.binary_replace_slice(text, 10, 11, "T")
    whole = pc.ends_with(text, ".000000")
    stamp = pc.if_else(whole, pc.binary_replace_slice(stamp, 19, 26, ""), stamp)
    suffix = "+00:00" if zoned else ""
    text = pc.binary_join_element_wise('"', stamp, suffix + '"', "")
    good = _between(column.cast(pa.int64()), _FIRST_MICROS, _LAST_MICROS)
    return _python(column, good, text, _dumps)


def _dates(column: pa.Array) -> pa.Array:
    text = pc.binary_join_element_wise('"', column.cast(pa.string()), '"', "")
    good = _between(column.cast(pa.int32()), _FIRST_DAY, _LAST_DAY)
    return _python(column, good, text, _dumps)


def _between(values: pa.Array, low: int, high: int) -> pa.Array:
    # bounds on the stored integers: pc.year() of a zoned timestamp converts every value
    return pc.and_(pc.greater_equal(values, low), pc.less_equal(values, high))
