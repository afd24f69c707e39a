"""Dates and timestamps as Delta writes them in a table's log, computed from Arrow's integers
(Python's ``datetime`` holds the years 1 to 9999 only, and ``strftime('%Y')`` does not pad
a year below 1000), and the partition values a Delta table cannot keep.

A Delta reader reads an empty partition value as null, delta-rs writes a timestamp or
date partition value past the year 9999 (``+10000-01-01 ...``) that it cannot read back,
and a negative decimal with a fractional part as text it cannot parse (``-1.-50``: its
commit fails), and no file system holds a partition directory whose name
``<column>=<value>`` is longer than 255 bytes (a long string, or a float such as
``1e300``, which delta-rs writes in full decimal digits; delta-rs panics, and
delta-spark's Spark task fails with ``Mkdirs failed
to create``): the name is the one the sink's engine makes (:data:`Engine`), so the rule is
checked against it:
:func:`unstorable_rows` finds such rows in an Arrow batch (:func:`holds_unstorable` tells
whether there is one), :func:`spark_unstorable` builds
the Spark condition finding them, and :class:`UnstorablePartitionValue` is what a writer
raises on meeting one. Every Delta writer of fanout refuses them alike (the batch fails
naming the column and value, or the rows go to the sink's dead-letter target).

Imports pyarrow lazily: only :mod:`fanout.delta_tables` uses it, and only when writing.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

from fanout.contract.calendar import MICROS_PER_DAY, civil, clock

if TYPE_CHECKING:
    import pyarrow as pa

Engine = Literal["rs", "spark"]
"""Which writer names a partition's directory: ``rs``, delta-rs and the executors' writer
(every byte of a character other than a letter, a digit or ``_.~-`` escaped as %XX), or
``spark``, delta-spark, which takes Spark's name (Spark's ``escapePathName``: only the
characters of :data:`_SPARK_ESCAPED` escaped, any other written as its UTF-8 bytes, and a
value as Spark casts it to a string: a float as ``1.0E300``, never too long)."""

_UNIT_MICROS = {"s": 1_000_000, "ms": 1_000, "us": 1}
_DAY_OF_YEAR_0 = -719_528  # 0000-01-01, in days since 1970-01-01 (proleptic Gregorian)
_DAY_OF_YEAR_10000 = 2_932_897  # 10000-01-01


class UnstorablePartitionValue(ValueError):
    """A partition value a Delta table cannot keep (raised by the executors' writer in a
    Spark task; the driver turns it into the sink's error)."""


def date_text(days: int) -> str:
    """``days`` since 1970-01-01 as ``YYYY-MM-DD`` (the year padded to 4 digits; a year
    past 9999 has more, a year before 0 a sign)."""
    year, month, day = civil(days)
    return f"{year:04d}-{month:02d}-{day:02d}"


def timestamp_text(micros: int, sep: str = " ") -> str:
    """``micros`` since the epoch as ``YYYY-MM-DD<sep>HH:MM:SS.ffffff``, the year padded
    as in :func:`date_text`."""
    days, hours, minutes, seconds, fraction = clock(micros)
    return f"{date_text(days)}{sep}{hours:02d}:{minutes:02d}:{seconds:02d}.{fraction:06d}"


def in_four_digit_years(days: int, *, first_year: int = 0) -> bool:
    """Whether ``days`` since 1970-01-01 falls in the years ``first_year`` (0 or 1) to 9999."""
    low = _DAY_OF_YEAR_0 if first_year == 0 else _DAY_OF_YEAR_0 + 366
    return low <= days < _DAY_OF_YEAR_10000


def micros_of(value: int, kind: pa.DataType, *, up: bool = False) -> int:
    """A timestamp's integer ``value`` (in ``kind``'s unit) in microseconds: rounded down,
    or up with ``up`` (a maximum must not shrink)."""
    if kind.unit == "ns":
        return -(-value // 1000) if up else value // 1000
    return int(value) * _UNIT_MICROS[kind.unit]


def partition_value(value: Any) -> str | None:
    """A partition value as Delta serializes it in ``partitionValues``."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value.isoformat(sep=" ", timespec="microseconds")  # the year padded: 0999
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, int | str):
        return str(value)
    raise TypeError(f"cannot write a partition value of type {type(value).__name__}")


def partition_text(value: pa.Scalar) -> str | None:
    """An Arrow partition value as Delta serializes it in ``partitionValues`` (``None``
    for null); a date or timestamp is computed from its integer, any year, a decimal in
    plain notation with every digit of its scale (``-12.00``). Raises
    :class:`UnstorablePartitionValue` for a value no Delta table can keep, naming the
    value; the caller adds the column."""
    import pyarrow as pa
    import pyarrow.types as pat

    if not value.is_valid:
        return None
    kind = value.type
    if pat.is_timestamp(kind):
        micros = micros_of(value.cast(pa.int64()).as_py(), kind)
        text = timestamp_text(micros)
        if not in_four_digit_years(micros // MICROS_PER_DAY):
            raise UnstorablePartitionValue(year_problem(text + (" UTC" if kind.tz else "")))
        return text
    if pat.is_date32(kind):
        days = value.cast(pa.int32()).as_py()
        if not in_four_digit_years(days):
            raise UnstorablePartitionValue(year_problem(date_text(days)))
        return date_text(days)
    if pat.is_floating(kind):
        return float_text(value.as_py(), kind.bit_width)
    if pat.is_decimal(kind):
        number = value.as_py()
        text = format(number, "f")  # plain notation, every digit of the scale: -1.50
        if number < 0 and number != number.to_integral_value():
            raise UnstorablePartitionValue(decimal_problem(text))
        return text
    serialized = partition_value(value.as_py())
    if serialized == "":
        raise UnstorablePartitionValue(EMPTY_PROBLEM)
    return serialized


def float_text(value: float, bits: int) -> str:
    """A float partition value as delta-rs writes it (Rust's ``Display``): the shortest
    digits that read back as the value (of a 32-bit float for ``bits`` 32 or less), in
    full decimal notation without an exponent: ``1e300`` is a 1 and 300 zeros. (Where two
    shortest texts of a 32-bit float are equally near, Rust's may end in the other digit:
    the length, which is what the sink checks, is the same.)"""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    shortest = repr(value) if bits == 64 else _shortest_float32(value)
    return format(Decimal(shortest).normalize(), "f")


def _shortest_float32(value: float) -> str:
    """The fewest significant digits that read back as the 32-bit float ``value``."""
    for digits in range(1, 10):
        text = f"{value:.{digits - 1}e}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == value:
            return text
    return repr(value)


MAX_NAME_BYTES = 255
"""The longest file or directory name local file systems (ext4, xfs, APFS, NTFS) and HDFS
(``dfs.namenode.fs-limits.max-component-length``) allow: a partition's directory
``<column>=<value>`` longer than this cannot be created (delta-rs fails the write with a
Rust panic in its writer)."""

# The characters a partition directory's name escapes: every byte of them is written as %XX
# (delta-rs' escaping and the executors' writer's, ``quote(v, safe="")``).
_ESCAPED = "[^A-Za-z0-9_.~-]"

# The characters Spark's partition directory names escape (ExternalCatalogUtils'
# charToEscape, off Windows), each written as %XX: the control characters and
# "#%'*/:=?\ DEL {[]^. A pattern both Java's regular expressions (Spark) and RE2 (Arrow) read.
_SPARK_ESCAPED = r"""[\x01-\x1f"#%'*/:=?\\\x7f{\[\]^]"""

_HOW_ESCAPED: dict[str, str] = {
    "rs": "a float is written in full decimal digits, 1e300 as 301 of them; each byte of a "
    "character other than a letter, a digit or _.~- is written as 3, %XX",
    "spark": "as Spark names it for delta-spark: each control character and each of "
    "\"#%'*/:=?\\{[]^ is written as 3 bytes, %XX, any other character as its UTF-8 bytes",
}


def directory_name(column: str, text: str, engine: Engine = "rs") -> str:
    """The name of the directory holding ``column``'s partition value ``text``, as
    ``engine``'s writer makes it (for ``rs``, the executors' writer's: delta-rs does not
    escape the column name, so its name is never longer)."""
    if engine == "spark":
        return f"{_spark_escaped(column)}={_spark_escaped(text)}"
    return f"{quote(column, safe='')}={quote(text, safe='')}"


def _spark_escaped(text: str) -> str:
    return re.sub(_SPARK_ESCAPED, lambda m: f"%{ord(m.group()):02X}", text)


def length_problem(
    column: str, text: str, shown: str | None = None, engine: Engine = "rs"
) -> str | None:
    """Why ``column``'s partition value ``text`` cannot be kept when its directory's name
    (:func:`directory_name`) is longer than :data:`MAX_NAME_BYTES` (``None`` when it
    fits); ``shown``: the value as the message names it (default: ``text``, shortened)."""
    size = len(directory_name(column, text, engine).encode())
    if size <= MAX_NAME_BYTES:
        return None
    if shown is None:
        shown = repr(text if len(text) <= 40 else text[:40] + "...")
        shown += f" ({len(text)} characters)" if len(text) > 40 else ""
    else:
        shown += f" (written as {len(text)} decimal characters)"
    return (
        f"holds {shown}, whose partition directory name ({column}=<value>, escaped) would "
        f"be {size} bytes, more than the {MAX_NAME_BYTES} a file system allows for a name "
        f"({_HOW_ESCAPED[engine]})"
    )


def value_problem(column: str, value: pa.Scalar, engine: Engine = "rs") -> str | None:
    """Why ``column``'s partition value ``value`` cannot be kept by a Delta table written
    by ``engine``, as :func:`refusal` takes it (``None`` when it can). For ``spark``, only
    a string can be refused: Spark's text of any other type is short, and delta-spark's
    dates and timestamps are those Spark holds."""
    import pyarrow.types as pat

    kind = value.type.value_type if pat.is_dictionary(value.type) else value.type
    if engine == "spark" and not (pat.is_string(kind) or pat.is_large_string(kind)):
        return None
    try:
        text = partition_text(value)
    except UnstorablePartitionValue as exc:
        return str(exc)
    if text is None:
        return None
    if engine == "spark" and "\x00" in text:
        return nul_problem(text)
    shown = repr(value.as_py()) if pat.is_floating(kind) else None
    return length_problem(column, text, shown, engine)


def nul_problem(text: str) -> str:
    """Why a string partition value holding a NUL character cannot be kept by a Delta
    table written by delta-spark: Spark's directory names do not escape it (its escaping
    starts at U+0001) and no file system name holds one (``Mkdirs failed to create``)."""
    shown = repr(text if len(text) <= 40 else text[:40] + "...")
    return (
        f"holds {shown}, whose NUL character (U+0000) Spark writes unescaped into the "
        "partition directory's name (as Spark names it for delta-spark), which no file "
        "system allows in a name"
    )


EMPTY_PROBLEM = (
    "holds the empty string '', which a Delta table cannot keep in a partition column "
    "(Delta reads an empty partition value as null)"
)


def decimal_problem(text: str) -> str:
    """Why a negative decimal partition value with a fractional part (``text``) cannot be
    kept by a table delta-rs writes: it writes the sign into the fraction too
    (``-1.-50`` for ``-1.50``, ``0.-5`` for ``-0.05``) and fails its commit on it."""
    return (
        f"holds {text}, a negative decimal with a fractional part, which delta-rs cannot "
        "write as a partition value (it writes -1.50 as '-1.-50' and fails the commit: "
        '"Failed to parse value"); partition by the value as text or scaled to an '
        "integer instead, or use engine 'spark'"
    )


def year_problem(shown: str) -> str:
    """Why a date or timestamp partition value ``shown`` cannot be kept."""
    return (
        f"holds {shown}, which a Delta table cannot keep in a partition column (a "
        "partition value holds the years 0 to 9999 only, in UTC for a timestamp; delta-rs "
        "cannot read a table holding another)"
    )


def refusal(column: str, problem: str) -> str:
    """The error text of a batch refused for ``column``'s value (``problem``: what
    :class:`UnstorablePartitionValue` said)."""
    return (
        f"partition column {column!r} {problem}. Replace the value in the stream (e.g. with "
        "null), or set the sink's option 'dead_letter' to set such rows aside"
    )


def unstorable_rows(
    table: pa.Table, columns: Sequence[str], engine: Engine = "rs"
) -> tuple[pa.ChunkedArray | pa.Array | None, list[tuple[str, str]]]:
    """The rows of ``table`` holding, in one of the partition ``columns``, a value no
    Delta table written by ``engine`` can keep: a mask (``None``: no such row) and, for
    each such row in order, its first column at fault and the problem (as :func:`refusal`
    takes them)."""
    import functools

    import pyarrow.compute as pc

    masks: list[tuple[str, Any]] = []
    for name in columns:
        if name in table.column_names:
            mask = _unstorable(table.column(name), name, engine)
            if mask is not None and pc.any(mask).as_py():
                masks.append((name, mask))
    if not masks:
        return None, []
    every = functools.reduce(pc.or_, [m for _, m in masks])
    faults = []
    for index in pc.indices_nonzero(every).to_pylist():
        name, _ = next((n, m) for n, m in masks if m[index].as_py())
        problem = value_problem(name, table.column(name)[index], engine)
        faults.append((name, problem or EMPTY_PROBLEM))  # always one: the mask found it
    return every, faults


def holds_unstorable(table: pa.Table, columns: Sequence[str]) -> bool:
    """Whether a row of ``table`` holds, in one of the partition ``columns``, a value no
    Delta table can keep (:func:`unstorable_rows`' masks only: no row is looked at)."""
    import pyarrow.compute as pc

    for name in columns:
        if name in table.column_names:
            mask = _unstorable(table.column(name), name)
            if mask is not None and pc.any(mask).as_py():
                return True
    return False


def _unstorable(column: pa.ChunkedArray, name: str, engine: Engine = "rs") -> Any:
    """The mask of the values of column ``name`` no Delta partition written by ``engine``
    can keep (nulls: false); ``None`` for a type that has none."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.types as pat

    kind = column.type
    if pat.is_dictionary(kind):
        column, kind = column.cast(kind.value_type), kind.value_type
    room = _room(name, engine)
    if engine == "spark":
        if not (pat.is_string(kind) or pat.is_large_string(kind)):
            return None
        plain = pc.utf8_length(pc.replace_substring_regex(column, _SPARK_ESCAPED, ""))
        escaped = pc.subtract(pc.utf8_length(column), plain)  # each 1 byte, written as 3
        size = pc.add(pc.binary_length(column), pc.multiply(escaped, 2))
        nul = pc.match_substring(column, "\x00")
        bad = pc.or_(pc.or_(pc.equal(column, ""), pc.greater(size, room)), nul)
        return pc.fill_null(bad, False)
    if pat.is_string(kind) or pat.is_large_string(kind):
        mask = pc.equal(column, "")
        if pc.any(pc.greater(pc.binary_length(column), room // 3)).as_py():
            # each byte escapes to 3 at most: only a value this long can be too long
            kept = pc.utf8_length(pc.replace_substring_regex(column, _ESCAPED, ""))
            escaped = pc.subtract(pc.multiply(pc.binary_length(column), 3), pc.multiply(kept, 2))
            mask = pc.or_(mask, pc.greater(escaped, room))
    elif pat.is_floating(kind):
        mask = _long_floats(column, room, kind.bit_width)
    elif pat.is_timestamp(kind):
        per_day = (
            MICROS_PER_DAY // _UNIT_MICROS[kind.unit]
            if kind.unit != "ns"
            else (MICROS_PER_DAY * 1000)
        )
        ints = column.cast(pa.int64())
        mask = pc.or_(
            pc.less(ints, _DAY_OF_YEAR_0 * per_day),
            pc.greater_equal(ints, _DAY_OF_YEAR_10000 * per_day),
        )
    elif pat.is_date32(kind):
        ints = column.cast(pa.int32())
        mask = pc.or_(pc.less(ints, _DAY_OF_YEAR_0), pc.greater_equal(ints, _DAY_OF_YEAR_10000))
    elif pat.is_decimal(kind) and kind.scale > 0:
        zero = pa.scalar(Decimal(0), kind)
        negative = pc.less(column, zero)
        # the ceiling of a negative value fits its type (of the widest positive one not)
        negatives = pc.if_else(negative, column, zero)
        mask = pc.and_(negative, pc.not_equal(negatives, pc.ceil(negatives)))
    else:
        return None
    return pc.fill_null(mask, False)


def _room(name: str, engine: Engine) -> int:
    """The bytes left for the escaped value in the directory name of column ``name``."""
    return MAX_NAME_BYTES - len(directory_name(name, "", engine).encode())


def _long_floats(column: pa.ChunkedArray, room: int, bits: int) -> Any:
    """The mask of the floats of ``column`` whose text is longer than ``room`` bytes. The
    text holds a sign, at most 17 significant digits and a dot, and the zeros the exponent
    asks for: only a magnitude of at least ``10**(room - 3)`` or below ``10**(21 - room)``
    can be too long, and just those values are written out (all of them when ``room`` is
    under 22, a column name of more than 232 bytes)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = column.cast(pa.float64())
    if room < 22:
        candidates = pc.is_valid(values)
    else:
        size = pc.abs(values)
        big = pc.greater_equal(size, 10.0 ** (room - 3))
        tiny = pc.and_(pc.greater(size, 0), pc.less(size, 10.0 ** (21 - room)))
        candidates = pc.fill_null(pc.and_(pc.is_finite(values), pc.or_(big, tiny)), False)
    flags = [False] * len(values)
    for index in pc.indices_nonzero(candidates).to_pylist():
        flags[index] = len(float_text(values[index].as_py(), bits)) > room
    return pa.array(flags, pa.bool_())


def spark_unstorable(
    schema: Any, columns: Sequence[str], *, engine: Engine
) -> list[tuple[str, Any]]:
    """For each of the partition ``columns`` of a Spark ``schema`` that may hold a value no
    Delta table written by ``engine`` can keep, the column and the Spark condition finding
    such rows: the empty string, which delta-spark too writes as null (delta-io/delta#2100),
    a string whose directory name (:func:`directory_name`, ``engine``'s) would be longer
    than :data:`MAX_NAME_BYTES`, for ``spark`` a string holding a NUL (:func:`nul_problem`),
    and for ``rs`` a timestamp outside the years 0 to 9999 in
    UTC (a Spark date, or a timestamp without zone, never leaves them; a float or decimal
    partition column is written by delta-rs from the driver, :func:`unstorable_rows`
    finds those: a negative decimal with a fractional part, :func:`decimal_problem`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, TimestampType

    conditions = []
    for name in columns:
        kind = next((f.dataType for f in schema.fields if f.name == name), None)
        column = F.col("`" + name.replace("`", "``") + "`")
        if isinstance(kind, StringType):
            size = _spark_name_bytes(column, engine)
            bad = (column == F.lit("")) | (size > F.lit(_room(name, engine)))
            if engine == "spark":  # Spark does not escape a NUL (nor can a name hold one)
                bad = bad | (F.instr(column, "\x00") > F.lit(0))
            conditions.append((name, bad))
        elif engine == "rs" and isinstance(kind, TimestampType):
            micros = F.unix_micros(column)
            low, high = _DAY_OF_YEAR_0 * MICROS_PER_DAY, _DAY_OF_YEAR_10000 * MICROS_PER_DAY
            conditions.append((name, (micros < F.lit(low)) | (micros >= F.lit(high))))
    return conditions


def _spark_name_bytes(column: Any, engine: Engine) -> Any:
    """The Spark expression of the bytes the string ``column`` takes escaped in a
    partition directory's name by ``engine`` (:func:`directory_name`)."""
    from pyspark.sql import functions as F

    if engine == "spark":
        plain = F.length(F.regexp_replace(column, F.lit(_SPARK_ESCAPED), F.lit("")))
        return F.octet_length(column) + (F.length(column) - plain) * 2
    kept = F.length(F.regexp_replace(column, F.lit(_ESCAPED), F.lit("")))
    return F.octet_length(column) * 3 - kept * 2
