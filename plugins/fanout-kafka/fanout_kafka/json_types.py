"""Which Spark column types the sink's JSON encoding (:mod:`fanout_kafka.values`) writes
faithfully, checked on the batch's schema before anything is produced.

Written as JSON: booleans, integers, floats, decimals (as text), strings, dates,
timestamps, times (ISO 8601), binary (base64, as Spark's ``to_json`` writes it), arrays,
structs and maps with string keys (as objects), of those types. Refused, with what to do:

- maps with keys of another type: JSON object keys are text, so their keys would come
  back as strings (or, as Arrow hands a map over, the map as a list of pairs);
- intervals: a day-time interval would be written as a float of seconds (no unit, and
  microseconds lost past 2^53), and year-month and calendar intervals have no Arrow form
  at all, so the batch would fail in its tasks;
- variant: Arrow carries it as its binary encoding, which would be written as base64;
- geometry, geography and user-defined types: their stored form, not their value;
- two columns, or two fields of one struct, of the same name: a row as a JSON object
  keeps one of them.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Unwritable:
    """A column whose values the sink cannot write as JSON faithfully.

    :param column: the batch column.
    :param path: where in it (``column``, ``column.field``, ``column[]`` for an array's
        elements, ``column{}`` for a map's values).
    :param type: the Spark type there (``simpleString``).
    :param why: why, and what to do instead.
    """

    column: str
    path: str
    type: str
    why: str

    def describe(self) -> str:
        """``column 'c' (type): why``, or ``column 'c' at c.f (type): why``."""
        where = "" if self.path == self.column else f" at {self.path}"
        return f"column {self.column!r}{where} ({self.type}): {self.why}"


def unwritable(schema: Any, columns: list[str] | None = None) -> list[Unwritable]:
    """The problems of writing ``columns`` (default: every column) of ``schema`` (a Spark
    ``StructType``) as JSON, in column order; empty when there are none."""
    fields = [f for f in schema.fields if columns is None or f.name in columns]
    found: list[Unwritable] = []
    counts = Counter(f.name for f in fields)
    for name in sorted(n for n, count in counts.items() if count > 1):
        kinds = ", ".join(f.dataType.simpleString() for f in fields if f.name == name)
        why = (
            f"{counts[name]} columns have this name and a JSON object keeps one of them; "
            "rename them in the query (... AS other_name)"
        )
        found.append(Unwritable(name, name, kinds, why))
    for field in fields:
        found += _walk(field.name, field.name, field.dataType)
    return found


def _walk(column: str, path: str, kind: Any) -> list[Unwritable]:
    from pyspark.sql import types as T

    def refused(why: str) -> list[Unwritable]:
        return [Unwritable(column, path, kind.simpleString(), why)]

    if isinstance(kind, T.ArrayType):
        return _walk(column, f"{path}[]", kind.elementType)
    if isinstance(kind, T.StructType):
        counts = Counter(f.name for f in kind.fields)
        twice = sorted(n for n, count in counts.items() if count > 1)
        if twice:
            return refused(
                f"field(s) {', '.join(map(repr, twice))} appear more than once and a JSON "
                "object keeps one of them; rename them in the query (named_struct(...))"
            )
        return [p for f in kind.fields for p in _walk(column, f"{path}.{f.name}", f.dataType)]
    if isinstance(kind, T.MapType):
        if not isinstance(kind.keyType, T.StringType | T.CharType | T.VarcharType):
            return refused(
                "a map's keys become the keys of a JSON object, which are text; cast them in "
                f"the query, e.g. transform_keys({column}, (k, v) -> CAST(k AS STRING)), or "
                f"write map_entries({column}) (an array of key/value objects)"
            )
        return _walk(column, f"{path}{{}}", kind.valueType)
    if isinstance(kind, T.DayTimeIntervalType | T.YearMonthIntervalType | T.CalendarIntervalType):
        return refused(
            "an interval has no faithful JSON form here (written as a float of seconds, or not "
            f"at all); cast it in the query, e.g. CAST({column} AS STRING), or a number of a "
            "stated unit"
        )
    if isinstance(kind, T.VariantType):
        return refused(
            "a variant would be written as its binary encoding; write its JSON text in the "
            f"query, to_json({column}), or extract its fields with variant_get"
        )
    if isinstance(kind, _geospatial()):
        wkb = f"ST_AsBinary({column})" if path == column else f"ST_AsBinary of the value at {path}"
        return refused(
            "a geometry or geography would be written in its stored form (an object of its "
            f"SRID and WKB bytes), not as a JSON value; write its WKB in the query, {wkb} "
            "(base64 in the JSON), and its SRID with ST_SRID when it matters"
        )
    if isinstance(kind, _written()):
        return []
    return refused(
        "values of this type would be written in their stored form, not as a JSON value; "
        f"convert it in the query to a type JSON holds (e.g. CAST({column} AS STRING), or "
        f"base64({column}) of its bytes)"
    )


@functools.cache
def _geospatial() -> tuple[type, ...]:
    """Spark's ``GEOMETRY`` and ``GEOGRAPHY`` types (Spark 4.1+; none before)."""
    from pyspark.sql import types as T

    return tuple(getattr(T, n) for n in ("GeometryType", "GeographyType") if hasattr(T, n))


@functools.cache
def _written() -> tuple[type, ...]:
    from pyspark.sql import types as T

    return (
        T.NullType, T.BooleanType, T.ByteType, T.ShortType, T.IntegerType, T.LongType,
        T.FloatType, T.DoubleType, T.DecimalType, T.StringType, T.CharType, T.VarcharType,
        T.BinaryType, T.DateType, T.TimestampType, T.TimestampNTZType, T.TimeType,
    )  # fmt: skip
