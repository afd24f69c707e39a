"""Spark types against PostgreSQL types: what may be written where, and what to create.

Rows travel as COPY text, so PostgreSQL parses every value: a Spark ``string`` may go to a
column of any type (``uuid``, ``inet``, an enum, ``integer``...), and a value it cannot parse
is a rejected row, reported with its column and value. A string is explicitly PostgreSQL's
to parse, its rounding included: ``'1.2345'`` into ``numeric(10,2)`` is stored as ``1.23``,
as it would be by an ``INSERT``. Other Spark types go to the columns that can hold them
without reinterpretation (see :data:`COMPATIBLE`), and only when PostgreSQL would not round
them silently on the way in (see :func:`loss`): a ``double`` into ``numeric(10,2)`` or
``real``, a ``decimal(10,4)`` into ``numeric(10,2)``, a ``bigint`` into ``double precision``
or a timestamp into ``timestamp(3)`` is refused before any row is written, and the query
casts it so that the rounding is its own choice. A value too large for its column
(``numeric field overflow``, ``integer out of range``) is no silent loss: the server refuses
the row, which is reported like any refused row.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
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


def stored_form(data_type: Any, column: str) -> str | None:
    """Why a batch column of Spark type ``data_type`` cannot be written: it holds, at any
    depth, a value Spark's Arrow conversion hands over in its stored form, a struct
    PostgreSQL would keep instead of the value (a ``GEOMETRY`` or ``GEOGRAPHY`` as
    ``{"srid": 0, "wkb": "\\x..."}``, a ``VARIANT`` as its binary encoding), and what to
    do; ``None`` when it holds none."""
    found = _stored_form_at(data_type, column)
    if found is None:
        return None
    path, kind = found
    at = "" if path == column else f" at {path}"
    name = _sql_name(column)
    if kind == "VARIANT":
        fix = f"write it as JSON text in the query: to_json({name}) AS {name}"
    elif path == column:
        fix = (
            f"write its WKB in the query: ST_AsBinary({name}) AS {name} (into a bytea "
            "column; its SRID with ST_SRID)"
        )
    else:
        fix = f"write its WKB in the query: ST_AsBinary of the value at {path}"
    return (
        f"it holds a Spark {kind}{at}, which would reach PostgreSQL as the struct of its "
        f"stored form, not as its value; {fix}"
    )


def _stored_form_at(data_type: Any, path: str) -> tuple[str, str] | None:
    from pyspark.sql import types as T

    if isinstance(data_type, T.VariantType):
        return path, "VARIANT"
    geospatial = {"GeometryType": "GEOMETRY", "GeographyType": "GEOGRAPHY"}  # Spark 4.1+
    for name, kind in geospatial.items():
        if isinstance(data_type, getattr(T, name, ())):
            return path, kind
    if isinstance(data_type, T.ArrayType):
        return _stored_form_at(data_type.elementType, f"{path}[]")
    if isinstance(data_type, T.MapType):
        return _stored_form_at(data_type.keyType, f"{path}.key") or _stored_form_at(
            data_type.valueType, f"{path}.value"
        )
    if isinstance(data_type, T.StructType):
        for field in data_type.fields:
            found = _stored_form_at(field.dataType, f"{path}.{field.name}")
            if found is not None:
                return found
    return None


def duplicate_field(data_type: Any, column: str) -> tuple[str, str] | None:
    """The first struct, at any depth of a batch column of Spark type ``data_type``, with
    two fields of one name: (its path, the name), ``None`` when there is none. Spark builds
    such a struct (``named_struct('a', 1, 'a', 2)``, a join's ``struct(l.*, r.*)``) but
    cannot hand it over as Arrow (``DUPLICATED_FIELD_NAME_IN_ARROW_STRUCT``), and a JSON
    object would keep one of the values."""
    from pyspark.sql import types as T

    if isinstance(data_type, T.ArrayType):
        return duplicate_field(data_type.elementType, f"{column}[]")
    if isinstance(data_type, T.MapType):
        return duplicate_field(data_type.keyType, f"{column}.key") or duplicate_field(
            data_type.valueType, f"{column}.value"
        )
    if not isinstance(data_type, T.StructType):
        return None
    seen: set[str] = set()
    for field in data_type.fields:
        if field.name in seen:
            return column, field.name
        seen.add(field.name)
    for field in data_type.fields:
        found = duplicate_field(field.dataType, f"{column}.{field.name}")
        if found is not None:
            return found
    return None


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


@dataclass(frozen=True)
class Loss:
    """What PostgreSQL would silently round in the values of a batch column written to a
    target column, and how the query makes that rounding its own choice."""

    what: str
    """What would be lost, as a clause: ``PostgreSQL would round its values to 2 decimal
    places``."""
    cast: str
    """The Spark type to cast the column to (``decimal(10,2)``, ``float``...; ``string``
    for a timestamp formatted by :attr:`pattern`)."""
    pattern: str | None = None
    """For a timestamp: the ``date_format`` pattern writing it as text for PostgreSQL to
    parse, instead of a cast."""
    in_utc: bool = False
    """For an instant into a column without time zone: format its UTC wall clock, which
    is what the sink stores there (``date_format`` alone writes the session's)."""

    def remedy(self, column: str) -> str:
        """What to do about batch column ``column``, as a PySpark expression and as a
        ``select`` expression of the sink's route."""
        col = f"F.col({_py(column)})"
        name = _sql_name(column)
        if self.in_utc:
            col = f"F.to_utc_timestamp({col}, F.current_timezone())"
            name = f"to_utc_timestamp({name}, current_timezone())"
        if self.pattern is not None:
            alias = _sql_name(column)
            return (
                f"format it as text in the query so the rounding is yours: "
                f"F.date_format({col}, {_py(self.pattern)}) (in a sink's select: "
                f"date_format({name}, '{self.pattern}') AS {alias})"
            )
        how = "cast it in the query so the rounding is yours"
        if self.cast == "string":  # no Spark type holds the column's scale
            how = "cast it to a string in the query, for PostgreSQL to parse and round"
        return f"{how}: {cast_in_query(column, self.cast)}"


def cast_in_query(column: str, cast: str) -> str:
    """Batch column ``column`` cast to Spark type ``cast``, as a PySpark expression and as
    a ``select`` expression of the sink's route."""
    name = _sql_name(column)
    return (
        f"F.col({_py(column)}).cast({_py(cast)}) "
        f"(in a sink's select: CAST({name} AS {cast}) AS {name})"
    )


# Significant decimal digits of a Spark type's values, for float targets (a type whose
# values have no more digits than the target keeps goes there as it is): an integer's
# widest value; FLT_DIG and DBL_DIG for the floats (a float's shortest text round-trips
# through real, a double's through double precision).
_DIGITS = {"tinyint": 3, "smallint": 5, "int": 10, "bigint": 19, "float": 6, "double": 15}
_TARGET_DIGITS = {"real": 6, "double precision": 15}
_MICROSECONDS = 6
"""The fraction of a Spark timestamp, and of PostgreSQL's ``timestamp`` without precision."""


def loss(data_type: Any, sa_type: Any) -> Loss | None:
    """What PostgreSQL would silently round in values of the Spark ``data_type`` written to
    a column of the reflected ``sa_type``, or ``None`` when every value arrives as it is.

    For the pairs :data:`COMPATIBLE` allows; a Spark ``string`` (PostgreSQL's to parse)
    and an all-null column lose nothing here."""
    from pyspark.sql import types as T
    from sqlalchemy import types as sa

    kind = spark_kind(data_type)
    if kind in ("string", "null"):
        return None
    target = target_kind(sa_type)
    if target == "numeric" and kind in ("int", "float", "decimal") and sa_type.scale is not None:
        # the decimal places of the source's values: an integer's none, a float's any
        places = 0 if kind == "int" else data_type.scale if kind == "decimal" else None
        if places is not None and places <= sa_type.scale:
            return None
        return Loss(
            f"PostgreSQL would round its values {_rounded_to(sa_type.scale)}",
            _decimal(sa_type.precision, sa_type.scale),
        )
    if target == "float" and kind in ("int", "float", "decimal"):
        name = "real" if isinstance(sa_type, sa.REAL) else "double precision"
        digits = data_type.precision if kind == "decimal" else _DIGITS[data_type.simpleString()]
        if digits <= _TARGET_DIGITS[name]:
            return None
        return Loss(
            f"PostgreSQL would round its values to the {_TARGET_DIGITS[name]} significant "
            f"digits a {name} holds",
            "float" if name == "real" else "double",
        )
    if target == "timestamp" and kind == "timestamp":
        precision = getattr(sa_type, "precision", None)
        if precision is None or precision >= _MICROSECONDS:
            return None
        pattern = "yyyy-MM-dd HH:mm:ss" + ("." + "S" * precision if precision else "")
        instant = isinstance(data_type, T.TimestampType)
        zoned = bool(getattr(sa_type, "timezone", False))
        if instant and zoned:  # its offset keeps the instant
            pattern += "XXX"
        seconds = f"{precision} decimal place{'s' if precision > 1 else ''} of a second"
        return Loss(
            f"PostgreSQL would round its values to {seconds if precision else 'whole seconds'}",
            "string",
            pattern,
            in_utc=instant and not zoned,
        )
    return None


def _rounded_to(scale: int) -> str:
    if scale > 0:
        return f"to {scale} decimal place{'s' if scale > 1 else ''}"
    return "to whole numbers" if scale == 0 else f"to multiples of {10**-scale}"


def _decimal(precision: int | None, scale: int) -> str:
    """The Spark type holding what a ``numeric(precision, scale)`` holds, as far as Spark
    can (38 digits); ``string`` when no Spark decimal has that scale."""
    if not 0 <= scale <= 38:
        return "string"
    return f"decimal({min(max(precision or 38, scale), 38)},{scale})"


def _py(text: str) -> str:
    """A Python string literal."""
    return json.dumps(text, ensure_ascii=False)


def _sql_name(name: str) -> str:
    """A column name in Spark SQL."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return name
    return "`" + name.replace("`", "``") + "`"


def max_length(sa_type: Any) -> int | None:
    """The declared length of ``varchar(n)``/``char(n)`` columns, else ``None``."""
    from sqlalchemy import types as sa

    if isinstance(sa_type, sa.String) and not isinstance(sa_type, (sa.Text, sa.Enum)):
        length = getattr(sa_type, "length", None)
        return int(length) if length else None
    return None


def changes_compare_as_text(sa_type: Any) -> bool:
    """Whether the upsert's no-op check (does an update change the stored row?) must
    compare this type's values as text: its ``=`` is missing or untrustworthy
    (:func:`orders_as_text`), or coarser than what the column stores
    (:func:`equality_is_coarse`: ``1.0 = 1.000`` in ``numeric``, yet the table keeps the
    text it was given). Equal text is an unchanged value for every type; the other types
    (``integer``, ``text``, ``timestamp``, ...) are compared natively, which is cheaper."""
    return orders_as_text(sa_type) or equality_is_coarse(sa_type)


def orders_as_text(sa_type: Any) -> bool:
    """Types ordered and compared only as text: ``json`` (no equality or ordering), a type
    SQLAlchemy did not recognise (``xml``, ``point`` and the other geometric types have no
    usable ``=``, ``box`` or ``circle`` compare areas; equal text is equal values for any
    of them), and arrays and domains of those."""
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql as pg

    if isinstance(sa_type, sa.types.NullType):
        return True
    inner = _element_type(sa_type)
    if inner is not None:
        return orders_as_text(inner)
    return isinstance(sa_type, pg.JSON) and not isinstance(sa_type, pg.JSONB)


def equality_is_coarse(sa_type: Any) -> bool:
    """Types whose ``=`` calls values equal that the column stores (and prints)
    differently: an unconstrained ``numeric`` keeps the scale it is given (``1.0`` and
    ``1.000``), ``real`` / ``double precision`` have ``-0`` and ``0``, ``citext`` ignores
    case, ``interval`` equates ``1 day`` and ``24 hours``, ``jsonb`` compares its numbers
    as ``numeric`` (``{"a": 1.0}`` and ``{"a": 1.00}``), ``numrange`` its bounds; and
    arrays and domains of those. A ``numeric(p, s)`` stores every value at scale ``s``:
    its ``=`` is exact."""
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql as pg

    inner = _element_type(sa_type)
    if inner is not None:
        return equality_is_coarse(inner)
    if isinstance(sa_type, sa.Float):  # before Numeric: Float is a Numeric
        return True
    if isinstance(sa_type, sa.Numeric):
        return sa_type.scale is None
    return isinstance(sa_type, (pg.CITEXT, pg.INTERVAL, pg.JSONB, pg.NUMRANGE))


def _element_type(sa_type: Any) -> Any:
    """The type inside an array or a domain, else ``None``."""
    import sqlalchemy as sa

    if isinstance(sa_type, sa.ARRAY):
        return sa_type.item_type
    base = without_domain(sa_type)
    return base if base is not sa_type else None


def without_domain(sa_type: Any) -> Any:
    """The type under ``sa_type``'s domains (a domain over a domain too), else
    ``sa_type`` itself."""
    from sqlalchemy.dialects import postgresql as pg

    domain = getattr(pg, "DOMAIN", None)  # SQLAlchemy >= 2.0 reflects domains as DOMAIN
    while domain is not None and isinstance(sa_type, domain):
        sa_type = sa_type.data_type
    return sa_type


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
