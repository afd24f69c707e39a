"""Dates and timestamps outside Python's years 1-9999 as the text Spark writes, from the
integers Arrow stores.

Spark holds dates and timestamps outside Python's years 1-9999 (``date_add(DATE'0001-01-01',
-1)`` is 0000-12-31); turned into Python objects (``to_pylist``, ``as_py``) they raise
``OverflowError``. :func:`python_safe` rewrites a table's date and timestamp columns (also
inside structs, arrays and maps) that hold such years into string columns before that
conversion: the ISO 8601 text Python's ``isoformat`` gives for years 1-9999, and for other
years the year as Spark's ``to_json`` and ``CAST(... AS STRING)`` write it: four digits, a
``-`` before years before year 0 (``-0001-11-28``, astronomical numbering) and a ``+``
before years after 9999 (``+10000-01-01``), proleptic Gregorian. Spark's ``from_json``
reads these back as the dates and timestamps they were. A string and a date are the same
JSON (quoted text), so a dead letter (:func:`fanout.contract.dead_letters.letter_rows`) and
the Kafka sink's JSON write them as they write any other date.

Imports pyarrow lazily, as :mod:`fanout.contract` does.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING

from fanout.contract.calendar import MICROS_PER_DAY, civil, clock

if TYPE_CHECKING:
    import pyarrow as pa

_ORDINAL_1970 = dt.date(1970, 1, 1).toordinal()
# Python's years 1-9999, as days and microseconds since 1970
_FIRST_DAY = dt.date(1, 1, 1).toordinal() - _ORDINAL_1970
_LAST_DAY = dt.date(9999, 12, 31).toordinal() - _ORDINAL_1970
_FIRST_MICROS = _FIRST_DAY * MICROS_PER_DAY
_LAST_MICROS = (_LAST_DAY + 1) * MICROS_PER_DAY - 1
_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1}
"""Microseconds per stored unit of the timestamps that can leave Python's years (a
nanosecond timestamp holds the years 1677-2262 only; a second or millisecond one is
written to the microsecond, as Spark holds it)."""


def date_text(days: int) -> str:
    """The date ``days`` after 1970-01-01 (any number of days), e.g. ``0000-12-31``."""
    year, month, day = civil(days)
    if year > 9999:
        shown = f"+{year}"
    elif year < 0:
        shown = f"-{-year:04d}"
    else:
        shown = f"{year:04d}"
    return f"{shown}-{month:02d}-{day:02d}"


def timestamp_text(micros: int, *, zoned: bool) -> str:
    """The timestamp ``micros`` after 1970-01-01T00:00 (UTC for an instant, ``zoned``,
    which gets ``+00:00``), as ``isoformat`` writes it: no fraction when it is zero."""
    days, hours, minutes, seconds, fraction = clock(micros)
    text = f"{date_text(days)}T{hours:02d}:{minutes:02d}:{seconds:02d}"
    if fraction:
        text += f".{fraction:06d}"
    return text + ("+00:00" if zoned else "")


def python_safe(table: pa.Table) -> pa.Table:
    """``table`` with each date or timestamp column holding a year outside 1-9999 (at any
    depth) as strings of :func:`date_text` / :func:`timestamp_text`; the table itself when
    it holds none."""
    import pyarrow as pa

    arrays = []
    changed = False
    for column in table.columns:
        whole = column.combine_chunks()
        safe = _safe(whole)
        changed = changed or safe is not None
        arrays.append(whole if safe is None else safe)
    if not changed:
        return table
    return pa.Table.from_arrays(arrays, names=table.column_names)


def python_safe_array(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """``values`` as :func:`python_safe` makes a column of it: itself when it holds no
    date or timestamp outside the years 1-9999."""
    import pyarrow as pa

    whole = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    safe = _safe(whole)
    return values if safe is None else safe


def _safe(array: pa.Array) -> pa.Array | None:
    """``array`` with such values as text, or ``None`` when it has none."""
    import pyarrow as pa

    kind = array.type
    if pa.types.is_date32(kind):
        return _texts(array.cast(pa.int32()), _FIRST_DAY, _LAST_DAY, date_text)
    if pa.types.is_timestamp(kind) and kind.unit in _PER_UNIT:
        zoned, scale = kind.tz is not None, _PER_UNIT[kind.unit]
        return _texts(
            array.cast(pa.int64()), -(-_FIRST_MICROS // scale), _LAST_MICROS // scale,
            lambda value: timestamp_text(value * scale, zoned=zoned),
        )  # fmt: skip
    if pa.types.is_struct(kind):
        children = array.flatten()
        safe = [_safe(child) for child in children]
        if all(s is None for s in safe):
            return None
        fields = [child if s is None else s for child, s in zip(children, safe, strict=True)]
        names = [kind.field(i).name for i in range(kind.num_fields)]
        return pa.StructArray.from_arrays(fields, names=names, mask=array.is_null())
    if pa.types.is_map(kind):
        keys, items = _safe(array.keys), _safe(array.items)
        if keys is None and items is None:
            return None
        return pa.MapArray.from_arrays(
            array.offsets, array.keys if keys is None else keys,
            array.items if items is None else items, mask=array.is_null(),
        )  # fmt: skip
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        values = _safe(array.values)
        if values is None:
            return None
        build = pa.ListArray if pa.types.is_list(kind) else pa.LargeListArray
        return build.from_arrays(array.offsets, values, mask=array.is_null())
    return None


def _texts(values: pa.Array, first: int, last: int, text: Callable[[int], str]) -> pa.Array | None:
    """``values`` (integers) as strings of ``text`` when one is outside ``first``-``last``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    inside = pc.and_(pc.greater_equal(values, first), pc.less_equal(values, last))
    if pc.all(inside).as_py() is not False:  # all inside (or all null)
        return None
    return pa.array([None if v is None else text(v) for v in values.to_pylist()], pa.string())
