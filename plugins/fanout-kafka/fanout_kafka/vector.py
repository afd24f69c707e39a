"""Record keys and JSON values built column by column with Arrow compute.

Encoding row by row in Python (``to_pylist`` then ``json.dumps``) costs about 20 µs a row,
which made the Kafka sink the slowest part of a fan-out. Here each column becomes one
array of JSON fragments (its values without their quotes when it has no nulls: the quotes
join the row's constant texts) and Arrow joins them row-wise in one pass, for less than a
tenth of that (``bench/bench_kafka_encode.py``).

The bytes are exactly those of the row-by-row path (:func:`fanout_kafka.values.json_bytes`
and :func:`fanout_kafka.records.to_bytes`): floats are Spark's text
(:mod:`fanout.contract.spark_text`); where Arrow formats a value differently (strings
needing escapes, years outside 1000-9999), that value is formatted by Python instead
(dates and timestamps from their stored integers, :mod:`fanout_kafka.temporal`: Spark
holds years Python cannot). Types without a column-wise form (decimals, binary, nested,
times, zoned timestamps other than UTC) return ``None``, and the caller encodes the batch
row by row.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from fanout.contract.spark_text import floating_text
from fanout_kafka.temporal import date_text, timestamp_text
from fanout_kafka.values import json_text

_UTC_ZONES = frozenset({"UTC", "Etc/UTC", "+00:00", "Z"})
# the years written column-wise (1000-9999), as microseconds and days since 1970
_FIRST_MICROS = -30_610_224_000_000_000  # 1000-01-01T00:00:00
_LAST_MICROS = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999
_FIRST_DAY = -354_285  # 1000-01-01
_LAST_DAY = 2_932_896  # 9999-12-31
_NEEDS_ESCAPE = r'["\\\x00-\x1f]'


def json_rows(table: pa.Table) -> pa.Array | None:
    """The JSON object of every row (``{"col":value,...}``, compact, UTF-8), or ``None``."""
    parts: list[str | pa.Array] = []
    for i, name in enumerate(table.column_names):
        pieces = _pieces(table.column(i))
        if pieces is None:
            return None
        parts += [("{" if i == 0 else ",") + json.dumps(name, ensure_ascii=False) + ":", *pieces]
    if not parts:
        return pa.array([b"{}"] * table.num_rows, pa.binary())
    return _joined([*parts, "}"])


def json_arrays(table: pa.Table, columns: Sequence[str]) -> pa.Array | None:
    """``[v1,v2,...]`` of the given columns for every row (a multi-column key), or ``None``."""
    parts: list[str | pa.Array] = []
    for i, name in enumerate(columns):
        pieces = _pieces(table.column(name))
        if pieces is None:
            return None
        parts += ["[" if i == 0 else ",", *pieces]
    return _joined([*parts, "]"])


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
    elif (quoted := _quoted(column)) is not None:
        text = pc.binary_join_element_wise(*quoted, "")
    else:
        return None
    return text.fill_null("null")


def _pieces(column: pa.ChunkedArray | pa.Array) -> list[str | pa.Array] | None:
    """A column's JSON text for the row's join, or ``None`` for unsupported types. The
    quotes of a column with no nulls are constants beside its values, joined once with the
    row's other constants (a join per column costs ~0.07 us a value); a column with nulls
    is its :func:`json_fragments` (a null value is ``null``, unquoted)."""
    column = _whole(column)
    if column.null_count == 0 and (quoted := _quoted(column)) is not None:
        return list(quoted)
    fragment = json_fragments(column)
    return None if fragment is None else [fragment]


def _quoted(column: pa.Array) -> tuple[str, pa.Array, str] | None:
    """For the types JSON quotes (text, UTC or naive timestamps, dates): the text before
    each value, the values' text, and the text after; ``None`` for other types."""
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return '"', _string_bodies(column.cast(pa.string())), '"'
    if pa.types.is_timestamp(kind) and kind.unit == "us" and _utc_or_naive(kind.tz):
        zoned = kind.tz is not None
        return '"', _timestamp_bodies(column), _offset(zoned) + '"'
    if pa.types.is_date32(kind):
        return '"', _date_bodies(column), '"'
    return None


def _joined(parts: Sequence[str | pa.Array]) -> pa.Array:
    """The row-wise concatenation of arrays and constant texts, as binary; neighbouring
    constants are merged first (each argument is one more pass over every row)."""
    merged: list[str | pa.Array] = []
    for part in parts:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] += part
        else:
            merged.append(part)
    args = [pa.scalar(p) if isinstance(p, str) else p for p in merged]
    return pc.binary_join_element_wise(*args, pa.scalar("")).cast(pa.binary())


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
    return json_text(value)


def _floats(column: pa.Array) -> pa.Array:
    """Each float's JSON text: Spark's (:func:`~fanout.contract.spark_text.floating_text`),
    a NaN or an infinity quoted, as :func:`~fanout_kafka.values.json_text` writes them."""
    text = floating_text(column)
    finite = pc.is_finite(column)
    if pc.all(finite.fill_null(True)).as_py():
        return text
    return pc.if_else(finite, text, pc.binary_join_element_wise('"', text, '"', ""))


def _string_bodies(column: pa.Array) -> pa.Array:
    """Each string's JSON text without its quotes: the value itself unless it needs escapes."""
    good = pc.invert(pc.match_substring_regex(column, _NEEDS_ESCAPE))
    return _python(column, good, column, _unquoted)


def _timestamp_bodies(column: pa.Array) -> pa.Array:
    """Each timestamp's ISO 8601 text without its quotes and UTC offset."""
    # Arrow prints a microsecond timestamp, its zone dropped (the UTC wall clock), as
    # "YYYY-MM-DD HH:MM:SS.ffffff"; Python's isoformat has "T" for the space and no zero
    # fraction. Editing that one text costs about half of formatting the seconds and the
    # fraction apart (and pc.year() of a zoned column converts every value). Years outside
    # 1000-9999 are formatted from their integers (Arrow 26 pads them as Python does, but
    # no other version was checked).
    text = column.cast(pa.timestamp("us")).cast(pa.string())
    stamp = pc.binary_replace_slice(text, 10, 11, "T")
    whole = pc.ends_with(text, ".000000")
    stamp = pc.if_else(whole, pc.binary_replace_slice(stamp, 19, 26, ""), stamp)
    micros = column.cast(pa.int64())
    good = _between(micros, _FIRST_MICROS, _LAST_MICROS)
    return _python(micros, good, stamp, lambda value: timestamp_text(value, zoned=False))


def _offset(zoned: bool) -> str:
    # a UTC timestamp (the only zone written column-wise) in isoformat
    return "+00:00" if zoned else ""


def _date_bodies(column: pa.Array) -> pa.Array:
    days = column.cast(pa.int32())
    good = _between(days, _FIRST_DAY, _LAST_DAY)
    return _python(days, good, column.cast(pa.string()), date_text)


def _unquoted(value: Any) -> str:
    return _dumps(value)[1:-1]


def _between(values: pa.Array, low: int, high: int) -> pa.Array:
    # bounds on the stored integers: pc.year() of a zoned timestamp converts every value
    return pc.and_(pc.greater_equal(values, low), pc.less_equal(values, high))
