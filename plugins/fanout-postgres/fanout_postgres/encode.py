"""One partition's Arrow rows as COPY CSV, and the checks that need no server round trip.

Runs on the executors. Values are rendered by Arrow's CSV writer (unquoted empty field =
NULL, ``""`` = empty string), after turning the types CSV cannot carry into text:
``binary`` becomes PostgreSQL's hex ``bytea`` input (``\\x...``) and nested values
(arrays, maps, structs) become JSON; an instant (a timestamp with a zone) is printed in UTC,
at the top level and inside nested values alike. A refused row's dead letter is the core's
JSON (:func:`row_json`, :func:`cell_json`), built on this path only.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from fanout.contract.calendar import MICROS_PER_DAY, civil, clock, iso_text
from fanout.contract.dead_letters import letter_rows
from fanout.contract.far_dates import python_safe_array
from fanout.contract.nested_types import holds_arrow_type
from fanout.contract.spark_json import float_json, spark_json
from fanout.contract.spark_text import double_text, number_text, plain_decimal
from fanout.contract.text import holds_invalid_utf8
from fanout.deadletters.layout import letter_json
from fanout_postgres.statements import ROW

_FIRST_DAY = dt.date(1, 1, 1).toordinal() - dt.date(1970, 1, 1).toordinal()
_LAST_DAY = dt.date(9999, 12, 31).toordinal() - dt.date(1970, 1, 1).toordinal()
"""The years 1-9999 in days since 1970-01-01: the dates Arrow prints as PostgreSQL reads
them."""

VALUE_SHOWN = 200
"""Longest value (characters) quoted in an error message."""


@dataclass(frozen=True)
class Check:
    """What the executor checks itself for one target column."""

    column: str
    not_null: bool
    max_length: int | None
    pg_type: str


@dataclass(frozen=True)
class Reject:
    """One row the target does not take: its position in the partition and why."""

    row: int
    reason: str
    column: str | None = None
    sqlstate: str | None = None
    columns: tuple[str, ...] = ()
    """The columns of a constraint over several (a CHECK reading two, a composite foreign
    key), which refused the row as a whole; ``column`` is then ``None``."""


def with_row_numbers(table: pa.Table) -> pa.Table:
    """``table`` plus the :data:`ROW` column: each row's position in the partition."""
    return table.append_column(ROW, pa.array(range(table.num_rows), pa.int32()))


def precheck(table: pa.Table, checks: Sequence[Check]) -> list[Reject]:
    """Rows that break a NOT NULL or a ``varchar(n)`` limit, first broken check per row."""
    first: dict[int, Reject] = {}
    for check in checks:
        column = table.column(check.column)
        if check.not_null and column.null_count:
            for i in _true_positions(pc.is_null(column)):
                first.setdefault(
                    i,
                    Reject(
                        i,
                        f'null value in column "{check.column}" violates not-null constraint',
                        check.column,
                        "23502",
                    ),
                )
        if check.max_length is not None and pa.types.is_string(column.type):
            # PostgreSQL drops excess trailing spaces silently; anything else is an error
            too_long = pc.greater(pc.utf8_length(pc.utf8_rtrim(column, " ")), check.max_length)
            for i in _true_positions(pc.fill_null(too_long, False)):
                first.setdefault(
                    i, Reject(i, f"value too long for type {check.pg_type}", check.column, "22001")
                )
        for i, sequence in invalid_nested(column).items():
            reason = 'invalid byte sequence for encoding "UTF8": ' + " ".join(
                f"0x{b:02x}" for b in sequence
            )
            first.setdefault(i, Reject(i, reason, check.column, "22021"))
    return [first[i] for i in sorted(first)]


def invalid_nested(column: Any) -> dict[int, bytes]:
    """The rows of a nested column (struct, array, map) holding a string that is not valid
    UTF-8, each with its first invalid byte sequence; empty for any other column. A Spark
    string may hold any bytes (``CAST(binary AS STRING)``): PostgreSQL refuses them at the
    top level (SQLSTATE 22021, a refused row), but inside a nested value they stopped the
    JSON encoding with a bare ``UnicodeDecodeError`` (the partition failed at every attempt)."""
    if not _holds_string(column.type) or not holds_invalid_utf8(column):
        return {}
    values = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    found: dict[int, bytes] = {}
    for i in range(len(values)):
        sequences: list[bytes] = []
        _repaired(values.slice(i, 1), sequences)
        if sequences:
            found[i] = sequences[0]
    return found


def _holds_string(kind: pa.DataType) -> bool:
    """Whether a nested type holds strings (a map's keys too); a string itself does not."""
    return not _is_string(kind) and holds_arrow_type(kind, _is_string)


def _is_string(kind: pa.DataType) -> bool:
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind))


def _repaired(values: pa.Array, found: list[bytes]) -> pa.Array:
    """``values`` with each string that is not valid UTF-8, at any depth, decoded with
    ``\\x..`` escapes for its invalid bytes (``a\\xffb``), each first invalid sequence
    appended to ``found``; rebuilt from its children, so no other value goes through
    Python (a nested date of a year Python has not stays as it is)."""
    kind = values.type
    if _is_string(kind):
        if not holds_invalid_utf8(values):
            return values
        text = [None if v is None else _decoded(v, found)
                for v in values.cast(pa.large_binary()).to_pylist()]  # fmt: skip
        return pa.array(text, kind)
    if not _holds_string(kind):
        return values
    values = pa.concat_arrays([values])  # offset 0: children line up with the rows
    mask = values.is_null() if values.null_count else None
    if pa.types.is_struct(kind):
        children = [_repaired(values.field(i), found) for i in range(kind.num_fields)]
        return pa.StructArray.from_arrays(children, fields=list(kind), mask=mask)
    if pa.types.is_map(kind):
        keys, items = _repaired(values.keys, found), _repaired(values.items, found)
        return pa.MapArray.from_arrays(values.offsets, keys, items, type=kind, mask=mask)
    inner = _repaired(values.values, found)
    if pa.types.is_fixed_size_list(kind):
        return pa.FixedSizeListArray.from_arrays(inner, type=kind, mask=mask)
    built = pa.LargeListArray if pa.types.is_large_list(kind) else pa.ListArray
    return built.from_arrays(values.offsets, inner, type=kind, mask=mask)


def _decoded(raw: bytes, found: list[bytes]) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        found.append(raw[exc.start : exc.end])
        return raw.decode("utf-8", "backslashreplace")


def blank_too_long(table: pa.Table, checks: Sequence[Check]) -> pa.Table:
    """``table`` with every value :func:`precheck` finds too long for its ``varchar(n)``,
    or nested and holding a string that is not UTF-8, set to NULL: a refused row as the
    staging table can hold it (upsert with ``order_by``: it still takes part in choosing
    its key's winner; see ``transaction``)."""
    for check in checks:
        bad = invalid_nested(table.column(check.column))
        if bad:
            i = table.column_names.index(check.column)
            values = table.column(i).combine_chunks()
            mask = pa.array(np.isin(np.arange(table.num_rows), list(bad)))
            table = table.set_column(
                i, check.column, pc.if_else(mask, pa.scalar(None, values.type), values)
            )
        if check.max_length is None:
            continue
        column = table.column(check.column)
        if not pa.types.is_string(column.type):
            continue
        too_long = pc.greater(pc.utf8_length(pc.utf8_rtrim(column, " ")), check.max_length)
        if pc.any(pc.fill_null(too_long, False)).as_py():
            blank = pc.if_else(pc.fill_null(too_long, False), pa.scalar(None, column.type), column)
            table = table.set_column(table.column_names.index(check.column), check.column, blank)
    return table


def blank_cell(table: pa.Table, position: int, column: str) -> pa.Table:
    """``table`` with the value of ``column`` at row ``position`` set to NULL."""
    i = table.column_names.index(column)
    values = table.column(i).combine_chunks()
    mask = pa.array(np.arange(table.num_rows) == position)
    return table.set_column(i, column, pc.if_else(mask, pa.scalar(None, values.type), values))


def _true_positions(mask: Any) -> list[int]:
    indices = pc.indices_nonzero(pc.fill_null(mask, False))
    return [int(i) for i in indices.to_pylist()]


def drop_rows(table: pa.Table, rows: Sequence[int]) -> pa.Table:
    """``table`` without the rows at these positions."""
    if not rows:
        return table
    positions = pa.array(range(table.num_rows), pa.int64())
    return table.filter(pc.invert(pc.is_in(positions, value_set=pa.array(rows, pa.int64()))))


def to_csv(table: pa.Table) -> bytes:
    """The rows as headerless CSV for ``COPY ... FROM STDIN WITH (FORMAT csv)``."""
    columns = [_csv_ready(table.column(i)) for i in range(table.num_columns)]
    ready = pa.table(columns, names=table.column_names)
    buffer = io.BytesIO()
    pcsv.write_csv(ready, buffer, pcsv.WriteOptions(include_header=False))
    return buffer.getvalue()


def row_at_line(table: pa.Table, line: int) -> int | None:
    """The row of ``to_csv(table)`` that a COPY error calls ``line`` (``None``: none).

    COPY counts physical lines, and a row's error names the last line of the row: a
    quoted line break inside a value counts, as PostgreSQL counts it. Until the end of
    the first row COPY does not know its line ending yet and counts ``\\r`` there;
    after it, ``\\n``. Only text columns carry raw line breaks (binary and nested
    values travel as hex and JSON)."""
    breaks = np.zeros(table.num_rows, np.int64)
    for column in table.columns:
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            counted = pc.count_substring(column, "\n").fill_null(0).to_numpy()
            breaks += np.asarray(counted, np.int64)
            if table.num_rows:
                first = column[0].as_py() or ""
                breaks[0] += first.count("\r") - first.count("\n")
    ends = np.cumsum(breaks + 1)
    found = np.flatnonzero(ends == line)
    return int(found[0]) if len(found) else None


def _csv_ready(column: Any) -> Any:
    kind = column.type
    if pa.types.is_timestamp(kind) and kind.tz is not None:
        # an instant as UTC text (``...Z``), as binary COPY sends it: Arrow would print it
        # in the column's zone (Spark's session zone), whose offset a ``timestamp`` column
        # drops and whose historical seconds (-04:56:02) it cuts to minutes
        return _far_text(column.cast(pa.timestamp(kind.unit, tz="UTC")))
    if pa.types.is_timestamp(kind) or pa.types.is_date32(kind):
        return _far_text(column)
    if pa.types.is_decimal(kind) or pa.types.is_float32(kind) or pa.types.is_float64(kind):
        return number_text(column)  # Spark's text: a text column keeps it as it is
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return pa.array(
            [None if v is None else "\\x" + v.hex() for v in column.to_pylist()], pa.string()
        )
    if pa.types.is_nested(kind) or pa.types.is_map(kind):
        dump = _nested_json(kind)
        values = _nested_values(column)
        return pa.array([None if v is None else dump(v) for v in values], pa.string())
    return column


_PER_MICRO = {"s": 1_000_000, "ms": 1_000, "us": 1}


def _far_text(column: Any) -> Any:
    """A top-level date or timestamp column as PostgreSQL reads it: itself, unless it
    holds a year outside 1-9999; then the column as text, those values written by
    :func:`_pg_text`. Arrow prints a year before 1 astronomically (``0000-12-31``,
    ``-0001-...``), which PostgreSQL refuses (it reads ``0001-12-31 BC``), and a year past
    about 32767 as ``<value out of range: ...>``."""
    kind = column.type
    date = pa.types.is_date32(kind)
    if not date and kind.unit not in _PER_MICRO:
        return column  # nanoseconds: the years 1677-2262 only
    scale = 1 if date else _PER_MICRO[kind.unit]
    first, last = _FIRST_DAY, _LAST_DAY
    if not date:
        first = -(-first * MICROS_PER_DAY // scale)
        last = ((last + 1) * MICROS_PER_DAY - 1) // scale
    values = column.cast(pa.int32() if date else pa.int64())
    outside = pc.fill_null(pc.or_(pc.less(values, first), pc.greater(values, last)), False)
    if not pc.any(outside).as_py():
        return column
    zoned = not date and kind.tz is not None
    text = column.cast(pa.string()).to_pylist()  # Arrow's text for the years 1-9999
    for i in _true_positions(outside):
        text[i] = _pg_text(int(values[i].as_py()) * scale, date=date, zoned=zoned)
    return pa.array(text, pa.string())


def _pg_text(value: int, *, date: bool, zoned: bool) -> str:
    """A date (``value`` in days since 1970-01-01) or timestamp (in microseconds) of any
    year as PostgreSQL's input: ``10000-01-01``, ``0001-12-31 BC`` for Spark's year 0
    (1 BC), the clock as Arrow prints it, ``Z`` after an instant's (UTC)."""
    days = value if date else value // MICROS_PER_DAY
    year, month, day = civil(days)
    text = f"{max(year, 1 - year):04d}-{month:02d}-{day:02d}"
    if not date:
        _, hours, minutes, seconds, fraction = clock(value)
        text += f" {hours:02d}:{minutes:02d}:{seconds:02d}.{fraction:06d}" + ("Z" if zoned else "")
    return text + (" BC" if year < 1 else "")


def _nested_values(column: Any) -> list[Any]:
    """A nested column's values for :func:`_nested_json`: a year Python has not as text
    (:func:`python_safe_array`), a ``float`` (32-bit) as the double of its Spark text
    (``0.1``, not ``0.10000000149011612``: :func:`~fanout.contract.float32.widened_array`)."""
    from fanout.contract.float32 import widened_array

    values: list[Any] = widened_array(python_safe_array(column)).to_pylist()
    return values


def _nested_json(kind: pa.DataType) -> Callable[[Any], str]:
    """How a nested value of Arrow type ``kind`` (from ``to_pylist``, float32 widened:
    :func:`_nested_values`) is written as JSON: by its type (:func:`_typed`), decimals as
    numbers when it holds any (:func:`_json_text`, else :func:`spark_json`), floats as
    Spark's ``to_json`` spells them (``1.0E20``, ``"NaN"``: JSON has no NaN). A type
    holding neither is written by ``json.dumps`` alone: :func:`spark_json`'s walk for
    floats would find none and cost ~3x the dump."""
    if holds_arrow_type(kind, pa.types.is_decimal):
        dump = _json_text
    elif holds_arrow_type(kind, pa.types.is_floating):
        dump = spark_json
    else:
        dump = _plain_json
    return lambda value: dump(_typed(value, kind))


def _plain_json(value: Any) -> str:
    """A nested value holding no float and no decimal, as :func:`spark_json` writes it."""
    return json.dumps(value, ensure_ascii=False)


def _typed(value: Any, kind: pa.DataType) -> Any:
    """A nested value (from ``to_pylist``) ready for JSON by its Arrow type: a map is an
    object (an empty one too), a decimal stays a :class:`~decimal.Decimal` (see
    :func:`_json_text`), a timestamp or a date is ISO 8601 text (:func:`iso_text`)."""
    if value is None:
        return None
    if pa.types.is_map(kind):
        return {_key(k, kind.key_type): _typed(v, kind.item_type) for k, v in value}
    if pa.types.is_struct(kind):
        return {f.name: _typed(value[f.name], f.type) for f in kind}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return [_typed(v, kind.value_type) for v in value]
    if pa.types.is_decimal(kind):
        return value
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        return _date_text(value)
    return _jsonable(value)


def _date_text(value: Any) -> str:
    """A nested date or timestamp as :func:`iso_text`; one outside Python's years 1-9999
    arrives as Spark's text already (:func:`~fanout.contract.far_dates.python_safe_array`)."""
    return value if isinstance(value, str) else iso_text(value)


def _key(key: Any, kind: pa.DataType) -> str:
    """A map key as a JSON object's name: a timestamp or a date as :func:`iso_text`, a
    binary key as its ``\\x`` hex (as a binary value in the same JSON)."""
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        return _date_text(key)
    if isinstance(key, bytes):
        return "\\x" + key.hex()
    if isinstance(key, bool):  # as JSON, Spark's to_json and PostgreSQL name it
        return "true" if key else "false"
    if isinstance(key, float):  # as Spark's to_json names it: 1.0E20, not Python's 1e+20
        return double_text(key)
    return str(key)


def _json_text(value: Any) -> str:
    """``json.dumps(value)``, but a :class:`~decimal.Decimal` is a JSON number of its own
    digits (``1.50``, as the CSV writer prints a top-level decimal), not a string, and a
    float is spelled as Spark's ``to_json`` spells it (:func:`float_json`); text is kept
    as it is (``ensure_ascii=False``, as :func:`spark_json` writes it)."""
    if isinstance(value, Decimal):
        return plain_decimal(value)
    if isinstance(value, float):
        return float_json(value)
    if isinstance(value, dict):
        items = (f"{_plain_json(k)}: {_json_text(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_json_text(v) for v in value) + "]"
    return _plain_json(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, list) and value and isinstance(value[0], tuple) and len(value[0]) == 2:
        return {str(k): _jsonable(v) for k, v in value}  # a Spark map arrives as pairs
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


NUL_TEXT = "\\u0000"
"""What a NUL character of a dead letter's ``row`` or ``value`` in a PostgreSQL table becomes
(the six characters ``\\u0000``): neither ``jsonb`` nor ``text`` holds one."""


def letter_safe(value: Any) -> Any:
    """A JSON-ready value as a PostgreSQL dead-letter table records it: NaN, Infinity and
    -Infinity as the strings PostgreSQL prints for them (``"NaN"``, ``"Infinity"``,
    ``"-Infinity"``; JSON has no such numbers) and each NUL in a string as
    :data:`NUL_TEXT`."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, str):
        return value.replace("\x00", NUL_TEXT)
    if isinstance(value, dict):
        return {letter_safe(k): letter_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [letter_safe(v) for v in value]
    return value


def jsonb_safe(text: str) -> str:
    """A dead letter's JSON (:func:`fanout.deadletters.layout.letter_json`) as ``jsonb``
    takes it: each NUL in a string (a key too) as :data:`NUL_TEXT`; else unchanged."""
    if "\\u0000" not in text:  # json.dumps writes every NUL so
        return text
    return json.dumps(letter_safe(json.loads(text)), ensure_ascii=False)


def row_json(table: pa.Table, row: int, sources: dict[str, str]) -> str:
    """Row ``row`` as a dead letter's ``row``, keyed by the batch's own column names: the
    JSON every dead-letter target holds (:func:`fanout.deadletters.layout.letter_json`:
    binary as base64, maps as objects, instants in UTC...). A NUL stays one (a PostgreSQL
    table takes it through :func:`jsonb_safe`)."""
    values = letter_rows(decodable(table.slice(row, 1)))[0]
    return letter_json({sources.get(k, k): v for k, v in values.items() if k != ROW})


def cell_json(table: pa.Table, row: int, column: str | None) -> str | None:
    """The value of one cell as a Delta dead letter's ``value``: the JSON of
    :func:`fanout.deadletters.layout.letter_json` (``None`` for SQL NULL or no column)."""
    if column is None or column not in table.column_names:
        return None
    value = letter_rows(decodable(table.slice(row, 1).select([column])))[0][column]
    return None if value is None else letter_json(value)


def cells_json(table: pa.Table, row: int, columns: Sequence[str], sources: dict[str, str]) -> str:
    """The values of several cells of row ``row`` (a constraint's columns) as one JSON
    object keyed by the batch's column names, in ``columns``' order: the JSON of
    :func:`fanout.deadletters.layout.letter_json`, as the row's own fields read. A column
    the batch does not write (its value is the table's default) is left out."""
    written = [c for c in columns if c in table.column_names]
    values = letter_rows(decodable(table.slice(row, 1).select(written)))[0]
    return letter_json({sources.get(c, c): values[c] for c in written})


def value_text(table: pa.Table, row: int, column: str | None) -> str | None:
    """The value of one cell as text (``None`` for SQL NULL or no column), as an error
    message shows it and a PostgreSQL dead-letter table's ``value`` (``text``) takes it (a
    NUL as :data:`NUL_TEXT`; a float as Spark's text: ``1.0E20``, ``NaN``; a decimal in plain
    notation with its scale: ``123.45``; binary as
    ``\\x`` hex; a timestamp or a date as ISO 8601, an instant in UTC: :func:`iso_text`)."""
    if column is None or column not in table.column_names:
        return None
    kind = table.column(column).type
    cell = decodable(table.slice(row, 1).select([column])).column(0)
    value = python_safe_array(cell)[0].as_py()
    if value is None:
        return None
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if pa.types.is_nested(kind) or pa.types.is_map(kind):  # as COPY got it
        text = _nested_json(kind)(_nested_values(cell)[0])
    elif pa.types.is_floating(kind):  # Spark's text: 1.0E20, NaN (as COPY got it)
        text = number_text(cell)[0].as_py()
    elif isinstance(value, dt.date | str) and pa.types.is_temporal(kind):
        text = _date_text(value)  # a datetime too: ISO 8601, an instant in UTC
    elif isinstance(value, Decimal):  # Spark's text, not JSON's quoted string ('"1.50"')
        text = plain_decimal(value)
    else:  # a scalar JSON has no type for (a time of day...) as its text, unquoted
        plain = _jsonable(value)
        text = plain if isinstance(plain, str) else json.dumps(plain, default=str)
    return text.replace("\x00", NUL_TEXT)


def decodable(table: pa.Table) -> pa.Table:
    """``table`` (a refused row, for its letter or its error) with each string, top-level
    or nested, that is not valid UTF-8 decoded with ``\\x..`` escapes for its invalid
    bytes (``a\\xffb``): a Spark string may hold any bytes (``CAST(binary AS STRING)``,
    the text source), which PostgreSQL refuses and Python cannot decode. Unchanged when
    every string is valid."""
    for i, field in enumerate(table.schema):
        if not holds_arrow_type(field.type, _is_string):
            continue
        if not holds_invalid_utf8(table.column(i)):
            continue
        table = table.set_column(i, field, _repaired(table.column(i).combine_chunks(), []))
    return table


def show(value: str | None) -> str:
    """A value for an error message: ``null``, or quoted and cut to :data:`VALUE_SHOWN`."""
    if value is None:
        return "null"
    cut = value if len(value) <= VALUE_SHOWN else value[:VALUE_SHOWN] + "..."
    return repr(cut)


class Rows:
    """A partition's rows, taken from Spark's iterator as they arrive; every chunk taken
    is kept (with its :data:`ROW` numbers) for re-copies and error reports."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._batches = batches
        self._chunks: list[pa.Table] = []
        self.count = 0

    @property
    def schema(self) -> pa.Schema | None:
        """The chunks' schema (with :data:`ROW`), once a chunk was taken."""
        return self._chunks[0].schema if self._chunks else None

    def next_chunk(self) -> pa.Table | None:
        """The next chunk, or ``None`` when Spark has no more."""
        batch = next(self._batches, None)
        if batch is None:
            return None
        chunk = pa.Table.from_batches([batch])
        numbers = pa.array(np.arange(self.count, self.count + chunk.num_rows, dtype=np.int32))
        chunk = chunk.append_column(ROW, numbers)
        self._chunks.append(chunk)
        self.count += chunk.num_rows
        return chunk

    def chunks(self) -> Iterator[pa.Table]:
        """Every chunk from the first: those taken already, then the rest as it comes."""
        i = 0
        while i < len(self._chunks) or self.next_chunk() is not None:
            yield self._chunks[i]
            i += 1

    def table(self) -> pa.Table:
        """Every row (taking what is left from Spark)."""
        while self.next_chunk() is not None:
            pass
        return pa.concat_tables(self._chunks)


class CopyStream:
    """A file-like object for ``copy_expert``: COPY data made chunk by chunk as Spark
    delivers rows, so PostgreSQL loads while Spark still shuffles. ``prepare`` turns a
    chunk into the table to send (dropping rows it rejects); ``encode`` renders it (CSV by
    default; see :mod:`fanout_postgres.binary`), between ``header`` and ``trailer``. An
    exception raised by ``prepare`` or ``encode`` is kept in :attr:`error` (psycopg2
    replaces it by a generic COPY failure)."""

    def __init__(
        self,
        rows: Rows,
        prepare: Callable[[pa.Table], pa.Table],
        encode: Callable[[pa.Table], bytes] = lambda table: to_csv(table),
        header: bytes = b"",
        trailer: bytes = b"",
    ) -> None:
        self._chunks = rows.chunks()
        self.prepare = prepare
        self.encode = encode
        self.error: BaseException | None = None
        self._buffer = header
        self._trailer = trailer
        self._pos = 0
        self._done = False

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes of COPY data (``b""`` at the end)."""
        try:
            while not self._done and (size < 0 or len(self._buffer) - self._pos < size):
                chunk = next(self._chunks, None)
                if chunk is None:
                    self._done = True
                    self._buffer = self._buffer[self._pos :] + self._trailer
                    self._pos = 0
                elif chunk.num_rows:
                    self._buffer = self._buffer[self._pos :] + self.encode(self.prepare(chunk))
                    self._pos = 0
        except BaseException as exc:
            self.error = exc
            raise
        end = len(self._buffer) if size < 0 else min(len(self._buffer), self._pos + size)
        piece = self._buffer[self._pos : end]
        self._pos = end
        return piece
