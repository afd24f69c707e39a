"""Spark types against PostgreSQL types: what may be written where, and what to create.

Rows travel as COPY text, so PostgreSQL parses every value: a Spark ``string`` may go to a
column of any type (``uuid``, ``inet``, an enum, ``integer``...), and a value it cannot parse
is a rejected row, reported with its column and value. Other Spark types go to the columns
that can hold them without reinterpretation (see :data:`COMPATIBLE`).
"""

from __future__ import annotations

from typing import Any

# Kinds of PostgreSQL target columns, from the reflected SQLAlchemy type.
TARGET_KINDS = ("text", "int", "numeric", "float", "bool", "date", "timestamp", "bytea", "json")

COMPATIBLE: dict[str, frozenset[str]] = {
    "text": frozenset({"string", "int", "float", "decimal", "bool", "date", "timestamp"}),
    "int": frozenset({"string", "int"}),
    "numeric": frozenset({"string", "int", "float", "decimal"}),
    "float": frozenset({"string", "int", "float", "decimal"}),
    "bool": frozenset({"string", "bool"}),
    "date": frozenset({"string", "date"}),
    "timestamp": frozenset({"string", "date", "timestamp"}),
    "bytea": frozenset({"string", "binary"}),
    "json": frozenset({"string", "nested"}),
    "other": frozenset({"string"}),
}
"""Target kind -> the Spark kinds it accepts (Spark ``null`` columns go anywhere)."""


def spark_kind(data_type: Any) -> str:
    """The kind of a Spark ``DataType``: string, int, float, decimal, bool, date,
    timestamp, binary, nested, null or unsupported."""
    from pyspark.sql import types as T

    checks: list[tuple[Any, str]] = [
        (T.StringType, "string"),
        ((T.ByteType, T.ShortType, T.IntegerType, T.LongType), "int"),
        ((T.FloatType, T.DoubleType), "float"),
        (T.DecimalType, "decimal"),
        (T.BooleanType, "bool"),
        (T.DateType, "date"),
        ((T.TimestampType, T.TimestampNTZType), "timestamp"),
        (T.BinaryType, "binary"),
        ((T.ArrayType, T.MapType, T.StructType), "nested"),
        (T.NullType, "null"),
    ]
    for classes, kind in checks:
        if isinstance(data_type, classes):
            return kind
    return "unsupported"


def target_kind(sa_type: Any) -> str:
    """The kind of a reflected SQLAlchemy column type (see :data:`COMPATIBLE`)."""
    from sqlalchemy import types as sa

    if isinstance(sa_type, (sa.Enum, sa.ARRAY)):
        return "other"
    if isinstance(sa_type, sa.Integer):
        return "int"
    if isinstance(sa_type, sa.Float):
        return "float"
    if isinstance(sa_type, sa.Numeric):
        return "numeric"
    if isinstance(sa_type, sa.String):
        return "text"
    if isinstance(sa_type, sa.Boolean):
        return "bool"
    if isinstance(sa_type, sa.DateTime):
        return "timestamp"
    if isinstance(sa_type, sa.Date):
        return "date"
    if isinstance(sa_type, sa.LargeBinary):
        return "bytea"
    if isinstance(sa_type, sa.JSON):
        return "json"
    return "other"


def max_length(sa_type: Any) -> int | None:
    """The declared length of ``varchar(n)``/``char(n)`` columns, else ``None``."""
    from sqlalchemy import types as sa

    if isinstance(sa_type, sa.String) and not isinstance(sa_type, (sa.Text, sa.Enum)):
        length = getattr(sa_type, "length", None)
        return int(length) if length else None
    return None


def compares_as_text(sa_type: Any) -> bool:
    """Types without an equality operator (``json``, ``xml``): compared as text when
    deciding whether an update changes anything."""
    from sqlalchemy.dialects import postgresql as pg

    return isinstance(sa_type, pg.JSON) and not isinstance(sa_type, pg.JSONB)


def type_for_create(data_type: Any) -> Any:
    """The SQLAlchemy type of a column created from a Spark ``DataType``."""
    from pyspark.sql import types as T
    from sqlalchemy import types as sa
    from sqlalchemy.dialects import postgresql as pg

    if isinstance(data_type, T.LongType):
        return sa.BigInteger()
    if isinstance(data_type, T.IntegerType):
        return sa.Integer()
    if isinstance(data_type, (T.ShortType, T.ByteType)):
        return sa.SmallInteger()
    if isinstance(data_type, T.DoubleType):
        return pg.DOUBLE_PRECISION()
    if isinstance(data_type, T.FloatType):
        return pg.REAL()
    if isinstance(data_type, T.DecimalType):
        return sa.Numeric(data_type.precision, data_type.scale)
    if isinstance(data_type, T.BooleanType):
        return sa.Boolean()
    if isinstance(data_type, T.DateType):
        return sa.Date()
    if isinstance(data_type, T.TimestampNTZType):
        return pg.TIMESTAMP(timezone=False)
    if isinstance(data_type, T.TimestampType):
        return pg.TIMESTAMP(timezone=True)
    if isinstance(data_type, T.BinaryType):
        return pg.BYTEA()
    if isinstance(data_type, (T.ArrayType, T.MapType, T.StructType)):
        return pg.JSONB()
    return sa.Text()
