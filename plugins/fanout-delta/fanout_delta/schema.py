"""Compare a batch's Arrow schema with a Delta table's, before writing.

delta-rs casts a batch to the table schema on write, and some of those casts lose data
silently (``2.5`` into a ``long`` column becomes ``2``, an ``int`` into a ``string`` column
becomes ``"5"``), while a MERGE without schema evolution silently drops new columns. So the
sink checks first and fails with a :class:`fanout.errors.SchemaMismatchError` naming the
columns. Differences that lose nothing are *benign* and accepted:

- nullability (delta-rs checks the values of NOT NULL columns itself);
- string / large_string / string_view, binary / large_binary / binary_view, and the list
  variants (Spark's ``toArrow`` and delta-rs do not agree on which they use);
- timestamps of any unit and any time zone into a ``timestamp`` column (Delta stores UTC
  microseconds); a timestamp *without* time zone only fits ``timestamp_ntz`` and vice versa;
- integers into a wider or equal integer, integers a float holds exactly (8/16/32-bit
  integers into ``double``, 8/16-bit integers into ``float``), floats into a wider float,
  decimals into a decimal that holds them, ``date32``/``date64``, dictionary-encoded values
  by their value type, all-null columns.

A ``long`` into a ``double`` column (or an ``int`` into a ``float`` one) is refused: a
double holds integers exactly only up to 2**53 (a float up to 2**24), and delta-rs would
round larger ones (the driver's append) or fail naming no column (the executors'). The
error names the cast that makes the rounding the query's own, as the PostgreSQL sink does
for ``bigint`` into ``double precision``.

Columns of the table missing from the batch are not a conflict: an append writes them as
null (see :func:`pad_missing_columns`), a merge keeps the target's values. So are fields of
a struct column (at any depth, in lists and maps too) the batch's struct lacks, in an
append: written as null, by the driver's writer and the executors' alike, as Delta on
Spark does; a NOT NULL one is refused (Delta on Spark refuses it too), and so is any in a
merge with delta-rs, which cannot plan it.

Delta column names are case-insensitive: a batch holding two names that differ only in
case (``Id`` and ``id``, or fields ``s.A`` and ``s.a``), or a name the table spells in
another case (batch ``ID``, table ``id``), is refused naming both spellings
(:func:`refuse_case_duplicates`, :func:`case_clashes`), whether or not ``merge_schema``
is set: delta-rs cannot write either (nor add the second spelling as a column).

Whether or not the table exists, every batch must carry the columns the options ``keys``,
``order_by`` and ``partition_by`` name (:func:`check_option_columns`), and delta-rs is not
given a Spark ``VARIANT`` (:func:`refuse_variants`), ``GEOMETRY`` or ``GEOGRAPHY``
(:func:`refuse_geospatial`): it would store the struct Spark's ``toArrow`` makes of it,
without an error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.types as pat

_INT_BITS = {
    pa.int8(): 8, pa.int16(): 16, pa.int32(): 32, pa.int64(): 64,
    pa.uint8(): 8, pa.uint16(): 16, pa.uint32(): 32, pa.uint64(): 64,
}  # fmt: skip
# Decimal digits needed to hold every value of an integer type.
_INT_DIGITS = {8: 3, 16: 5, 32: 10, 64: 20}
# The widest integer type whose every value a float of this width holds exactly (its
# significand: 11, 24 and 53 bits).
_FLOAT_EXACT_INT_BITS = {16: 8, 32: 16, 64: 32}
# A float column's Spark type, and the bits of the integers it holds exactly.
_FLOAT_SPARK = {16: ("float", 11), 32: ("float", 24), 64: ("double", 53)}


@dataclass
class SchemaDiff:
    """What keeps a batch from being written to a table as it is.

    :param new_columns: batch columns the table does not have.
    :param conflicts: ``(column, table type, batch type)`` for columns whose batch type
        cannot be written to the table's type without loss.
    :param missing: table columns the batch does not have (``(name, nullable)``).
    :param rounded: ``(column, table type, batch type)`` for integer columns whose values
        the table's float column would round (a ``long`` into a ``double``).
    :param missing_fields: ``(path, nullable)`` of the fields of the table's struct
        columns (``s.b``, ``l[].b``, ``m.value.b``) the batch's structs lack.
    """

    new_columns: list[str] = field(default_factory=list)
    conflicts: list[tuple[str, pa.DataType, pa.DataType]] = field(default_factory=list)
    missing: list[tuple[str, bool]] = field(default_factory=list)
    rounded: list[tuple[str, pa.DataType, pa.DataType]] = field(default_factory=list)
    missing_fields: list[tuple[str, bool]] = field(default_factory=list)

    def problems(self, *, merge_schema: bool, merge: bool = False) -> tuple[list[str], str]:
        """The offending column names and a message explaining them ('' when none);
        ``merge``: the batch is merged (delta-rs), which cannot leave a struct's field out."""
        columns: list[str] = []
        parts: list[str] = []
        if self.new_columns and not merge_schema:
            columns += self.new_columns
            parts.append(
                f"column(s) {', '.join(map(repr, self.new_columns))} not in the table"
                "; set merge_schema=True to add them, or drop them from the stream"
            )
        if self.conflicts:
            columns += [name for name, _, _ in self.conflicts]
            details = ", ".join(f"{n!r} (table {t}, batch {b})" for n, t, b in self.conflicts)
            parts.append(
                f"type conflict in column(s) {details}; cast them in the stream to the "
                "table's types (delta-rs would cast lossily or fail)"
            )
        for name, table_type, batch_type in self.rounded:
            columns.append(name)
            spark_type, bits = _FLOAT_SPARK[table_type.bit_width]
            parts.append(
                f"column {name!r} (table {table_type}, batch {batch_type}) cannot be written "
                f"without loss: a {spark_type} holds integers exactly only up to 2**{bits}, "
                f"delta-rs would round larger ones; cast it in the query so the rounding is "
                f"yours: {_cast_in_query(name, spark_type)}, or write it to an integer "
                "column"
            )
        required = [name for name, nullable in self.missing if not nullable]
        if required:
            columns += required
            parts.append(
                f"NOT NULL column(s) {', '.join(map(repr, required))} missing from the batch"
            )
        fields = [p for p, nullable in self.missing_fields if merge or not nullable]
        if fields:
            columns += list(dict.fromkeys(_column_of(p) for p in fields))
            why = (
                "a merge with delta-rs cannot update a struct without all its fields"
                if merge
                else "they are NOT NULL in the table"
            )
            parts.append(
                f"field(s) {', '.join(map(repr, fields))} of the table missing from the "
                f"batch's struct(s) ({why}); add them to the struct in the stream, e.g. "
                "F.struct(..., F.lit(None).cast('<type>').alias('<field>')) for a null"
            )
        return columns, "; ".join(parts)


def diff_schemas(table: pa.Schema, batch: pa.Schema, *, merge_schema: bool) -> SchemaDiff:
    """Compare ``batch`` (what will be written) with ``table`` (the Delta table's schema)."""
    diff = SchemaDiff()
    batch_names = set(batch.names)
    for f in batch:
        index = table.get_field_index(f.name)
        if index < 0:
            diff.new_columns.append(f.name)
        elif not fits(table.field(index).type, f.type, merge_schema=merge_schema):
            target = table.field(index).type
            kind = f.type.value_type if pat.is_dictionary(f.type) else f.type
            if pat.is_floating(target) and pat.is_integer(kind):
                diff.rounded.append((f.name, target, f.type))
            else:
                diff.conflicts.append((f.name, target, f.type))
        else:
            diff.missing_fields += missing_fields(table.field(index).type, f.type, f.name)
    diff.missing = [(f.name, f.nullable) for f in table if f.name not in batch_names]
    return diff


def missing_fields(target: pa.DataType, source: pa.DataType, path: str) -> list[tuple[str, bool]]:
    """``(path, nullable)`` of the fields nested in a table column of type ``target``
    (named ``path``) that the batch's type ``source`` lacks."""
    if pat.is_dictionary(source):
        source = source.value_type
    if pat.is_struct(target) and pat.is_struct(source):
        found: list[tuple[str, bool]] = []
        for child in target:
            index = source.get_field_index(child.name)
            inner = f"{path}.{child.name}"
            if index < 0:
                found.append((inner, child.nullable))
            else:
                found += missing_fields(child.type, source.field(index).type, inner)
        return found
    if _is_list(target) and _is_list(source):
        return missing_fields(target.value_type, source.value_type, f"{path}[]")
    if pat.is_map(target) and pat.is_map(source):
        return missing_fields(target.key_type, source.key_type, f"{path}.key") + (
            missing_fields(target.item_type, source.item_type, f"{path}.value")
        )
    return []


def _column_of(path: str) -> str:
    """The top-level column of a nested field's ``path`` (``s`` of ``s.b``, ``l`` of
    ``l[].b``); column names holding dots are rare enough to be named by their start."""
    return re.split(r"\.|\[\]", path, maxsplit=1)[0]


def case_clashes(table: pa.Schema, batch: pa.Schema) -> list[tuple[str, str]]:
    """``(batch path, table path)`` of the batch's columns and struct fields the table
    spells in another case only (batch ``ID``, table ``id``; ``s.A`` and ``s.a``)."""
    return _clashes(list(table), list(batch), "")


def _clashes(table: list[pa.Field], batch: list[pa.Field], prefix: str) -> list[tuple[str, str]]:
    exact = {f.name: f for f in table}
    lowered = {f.name.lower(): f for f in table}
    found: list[tuple[str, str]] = []
    for f in batch:
        if f.name in exact:
            found += [
                (prefix + b, prefix + t)
                for b, t in _nested_clashes(exact[f.name].type, f.type, f.name)
            ]
        elif f.name.lower() in lowered:
            found.append((prefix + f.name, prefix + lowered[f.name.lower()].name))
    return found


def _nested_clashes(target: pa.DataType, source: pa.DataType, path: str) -> list[tuple[str, str]]:
    if pat.is_struct(target) and pat.is_struct(source):
        return _clashes(list(target), list(source), f"{path}.")
    if _is_list(target) and _is_list(source):
        return _nested_clashes(target.value_type, source.value_type, f"{path}[]")
    if pat.is_map(target) and pat.is_map(source):
        return _nested_clashes(target.item_type, source.item_type, f"{path}.value")
    return []


def case_duplicates(schema: pa.Schema) -> list[tuple[str, str]]:
    """Pairs of the batch's column names (and names of fields of one struct, as paths)
    that differ only in case: a Delta table cannot hold both."""
    return _duplicates(list(schema), "")


def _duplicates(fields: list[pa.Field], prefix: str) -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    found: list[tuple[str, str]] = []
    for f in fields:
        first = seen.setdefault(f.name.lower(), f.name)
        if first != f.name:
            found.append((prefix + first, prefix + f.name))
        found += _nested_duplicates(f.type, f"{prefix}{f.name}")
    return found


def _nested_duplicates(kind: pa.DataType, path: str) -> list[tuple[str, str]]:
    if pat.is_struct(kind):
        return _duplicates(list(kind), f"{path}.")
    if _is_list(kind):
        return _nested_duplicates(kind.value_type, f"{path}[]")
    if pat.is_map(kind):
        return _nested_duplicates(kind.key_type, f"{path}.key") + _nested_duplicates(
            kind.item_type, f"{path}.value"
        )
    return []


def refuse_case_duplicates(names: pa.Schema | Sequence[str], *, sink: str,
                           batch_id: int | None) -> None:  # fmt: skip
    """Raise :class:`fanout.errors.SchemaMismatchError` when two of the batch's column
    names (or field names of one of its structs), of ``names`` (a schema, or the top-level
    names alone), differ only in case: Delta names are case-insensitive."""
    from fanout.errors import SchemaMismatchError

    schema = names if isinstance(names, pa.Schema) else pa.schema([(n, pa.null()) for n in names])
    found = case_duplicates(schema)
    if not found:
        return
    pairs = ", ".join(f"{a!r} and {b!r}" for a, b in found)
    raise SchemaMismatchError(
        f"the batch holds {pairs}, names that differ only in case: Delta column names are "
        "case-insensitive, so a Delta table cannot hold both; rename or drop one of each "
        "pair in the stream (e.g. in a sink's select: "
        f"{_sql_name(found[0][1].split('.')[-1])} AS "
        f"{_sql_name(found[0][1].split('.')[-1] + '_2')})",
        sink=sink,
        batch_id=batch_id,
        columns=list(dict.fromkeys(_column_of(p) for pair in found for p in pair)),
    )


def fits(target: pa.DataType, source: pa.DataType, *, merge_schema: bool = False) -> bool:
    """Whether values of type ``source`` can be written to a ``target`` column without loss."""
    if pat.is_null(source) or target.equals(source):
        return True
    if pat.is_dictionary(source):
        return fits(target, source.value_type, merge_schema=merge_schema)
    if _is_string(target) and _is_string(source):
        return True
    if _is_binary(target) and (_is_binary(source) or pat.is_fixed_size_binary(source)):
        return True
    if pat.is_integer(target) and pat.is_integer(source):
        return _int_fits(target, source)
    if pat.is_floating(target):
        if pat.is_floating(source):
            return target.bit_width >= source.bit_width
        if pat.is_integer(source):  # only integers the float's significand holds
            return _INT_BITS[source] <= _FLOAT_EXACT_INT_BITS[target.bit_width]
        return False
    if pat.is_decimal(target):
        return _decimal_fits(target, source)
    if pat.is_timestamp(target) and pat.is_timestamp(source):
        return (target.tz is None) == (source.tz is None)
    if pat.is_date(target) and pat.is_date(source):
        return True
    if _is_list(target) and _is_list(source):
        return fits(target.value_type, source.value_type, merge_schema=merge_schema)
    if pat.is_map(target) and pat.is_map(source):
        return fits(target.key_type, source.key_type, merge_schema=merge_schema) and fits(
            target.item_type, source.item_type, merge_schema=merge_schema
        )
    if pat.is_struct(target) and pat.is_struct(source):
        for child in source:
            index = target.get_field_index(child.name)
            if index < 0:
                if not merge_schema:
                    return False
            elif not fits(target.field(index).type, child.type, merge_schema=merge_schema):
                return False
        return True
    return False


def evolves(table: pa.Schema, batch: pa.Schema) -> bool:
    """Whether writing ``batch`` changes the table's schema: a column, or a field nested
    in one, that the table lacks. A batch that adds nothing is written without delta-rs'
    schema evolution, which a table with column mapping refuses even then."""
    for f in batch:
        index = table.get_field_index(f.name)
        if index < 0 or not fits(table.field(index).type, f.type, merge_schema=False):
            return True
    return False


def nullable_new_columns(batch: pa.Table, table: pa.Schema) -> pa.Table:
    """``batch`` with each top-level column the table lacks (one ``merge_schema`` adds)
    made nullable, as Delta on Spark adds every new column: the rows already in the table
    hold no value there. delta-rs added a non-nullable batch column (``F.lit(1)``,
    ``current_timestamp()``) as NOT NULL, which left the table unreadable ("Non-nullable
    column ... is missing from the physical schema") and every later batch without the
    column refused. Unchanged (the same object) when there is none."""
    known = {name.lower() for name in table.names}
    fields = [
        f.with_nullable(True) if not f.nullable and f.name.lower() not in known else f
        for f in batch.schema
    ]
    if all(a is b for a, b in zip(fields, batch.schema, strict=True)):
        return batch
    return batch.cast(pa.schema(fields, metadata=batch.schema.metadata))


def pad_missing_columns(batch: pa.Table, table: pa.Schema) -> pa.Table:
    """Add the nullable table columns the batch lacks, as all-null columns, and the
    nullable fields the batch's structs lack, as null fields.

    delta-rs refuses an append whose column count, or a struct's field count, differs
    from the table's (Delta on Spark writes nulls; so does the executors' writer), so
    every writer behaves alike. A generated column the batch lacks is left out: delta-rs
    computes it (a null there broke its generation expression, failing every append).
    """
    for index, f in enumerate(batch.schema):
        if table.get_field_index(f.name) < 0:
            continue
        padded = _padded(table.field(f.name).type, f.type)
        if not padded.equals(f.type):
            column = batch.column(index).cast(padded)  # by name: the fields added are null
            batch = batch.set_column(index, f.with_type(padded), column)
    for f in table:
        if f.name not in batch.column_names and f.nullable and not is_generated(f):
            batch = batch.append_column(f, pa.nulls(batch.num_rows, type=f.type))
    return batch


GENERATION_EXPRESSION = b"delta.generationExpression"
"""The field metadata key of a Delta generated column (as delta-rs hands it in Arrow)."""


def is_generated(field: pa.Field) -> bool:
    """Whether ``field`` (of a table's Arrow schema) is a generated column."""
    return GENERATION_EXPRESSION in (field.metadata or {})


def _padded(target: pa.DataType, source: pa.DataType) -> pa.DataType:
    """``source`` with the fields of the structs in ``target`` it lacks added (after its
    own), through lists and maps."""
    if pat.is_struct(target) and pat.is_struct(source):
        fields = [
            c if target.get_field_index(c.name) < 0
            else c.with_type(_padded(target.field(c.name).type, c.type))
            for c in source
        ]  # fmt: skip
        fields += [c for c in target if source.get_field_index(c.name) < 0]
        return pa.struct(fields)
    if (pat.is_list(target) or pat.is_large_list(target)) and (
        pat.is_list(source) or pat.is_large_list(source)
    ):
        item = source.value_field.with_type(_padded(target.value_type, source.value_type))
        return pa.large_list(item) if pat.is_large_list(source) else pa.list_(item)
    if pat.is_map(target) and pat.is_map(source):
        item = source.item_field.with_type(_padded(target.item_type, source.item_type))
        return pa.map_(source.key_field, item)
    return source


def _int_fits(target: pa.DataType, source: pa.DataType) -> bool:
    target_bits, source_bits = _INT_BITS[target], _INT_BITS[source]
    if pat.is_signed_integer(source):
        return pat.is_signed_integer(target) and target_bits >= source_bits
    if pat.is_unsigned_integer(target):
        return target_bits >= source_bits
    return target_bits > source_bits


def _decimal_fits(target: pa.DataType, source: pa.DataType) -> bool:
    whole = target.precision - target.scale
    if pat.is_decimal(source):
        return source.scale <= target.scale and source.precision - source.scale <= whole
    if pat.is_integer(source):
        return _INT_DIGITS[_INT_BITS[source]] <= whole
    return False


def _cast_in_query(column: str, spark_type: str) -> str:
    """Batch column ``column`` cast to ``spark_type``, as a PySpark expression and as a
    ``select`` expression of the sink's route."""
    name = _sql_name(column)
    return (
        f"F.col({json.dumps(column, ensure_ascii=False)}).cast({json.dumps(spark_type)}) "
        f"(in a sink's select: CAST({name} AS {spark_type}) AS {name})"
    )


def _sql_name(name: str) -> str:
    """A column name in Spark SQL."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return name
    return "`" + name.replace("`", "``") + "`"


def _is_string(t: pa.DataType) -> bool:
    return pat.is_string(t) or pat.is_large_string(t) or pat.is_string_view(t)


def _is_binary(t: pa.DataType) -> bool:
    return pat.is_binary(t) or pat.is_large_binary(t) or pat.is_binary_view(t)


def _is_list(t: pa.DataType) -> bool:
    return (
        pat.is_list(t)
        or pat.is_large_list(t)
        or pat.is_fixed_size_list(t)
        or pat.is_list_view(t)
        or pat.is_large_list_view(t)
    )


def check_batch_schema(
    table: pa.Schema,
    batch: pa.Schema,
    *,
    merge_schema: bool,
    sink: str,
    batch_id: int | None,
    merge: bool = False,
) -> None:
    """Raise :class:`fanout.errors.SchemaMismatchError` when ``batch`` cannot be written
    to a table of schema ``table``; the error names the columns and what to do.
    ``merge``: the batch is merged with delta-rs (a struct must carry all its fields)."""
    from fanout.errors import SchemaMismatchError

    clashes = case_clashes(table, batch)
    if clashes:
        pairs = ", ".join(f"{b!r} (the table has {t!r})" for b, t in clashes)
        fixes = ", ".join(
            f"{_sql_name(b.split('.')[-1])} AS {_sql_name(t.split('.')[-1])}" for b, t in clashes
        )
        raise SchemaMismatchError(
            f"the batch spells {pairs} in another case: Delta column names are "
            "case-insensitive, so these name the table's column, which the sink writes only "
            "under the table's spelling (delta-rs cannot write it from another, nor add it "
            f"as a new one, with merge_schema too; every engine refuses alike); rename them in "
            f"the stream to the table's spelling (in a sink's select: {fixes})",
            sink=sink,
            batch_id=batch_id,
            columns=list(dict.fromkeys(_column_of(b) for b, _ in clashes)),
        )
    diff = diff_schemas(table, batch, merge_schema=merge_schema)
    columns, message = diff.problems(merge_schema=merge_schema, merge=merge)
    if columns:
        raise SchemaMismatchError(
            f"the batch does not fit the Delta table: {message}",
            sink=sink,
            batch_id=batch_id,
            columns=columns,
        )


def check_option_columns(
    batch: Sequence[str],
    options: Mapping[str, Sequence[str] | None],
    *,
    sink: str,
    batch_id: int | None,
) -> None:
    """Raise :class:`fanout.errors.SchemaMismatchError` when an option naming columns
    (``keys``, ``order_by``, ``partition_by``) names one the batch, of columns ``batch``,
    lacks: every batch must carry them, whether or not the table exists yet."""
    from fanout.errors import SchemaMismatchError

    present = set(batch)
    lowered = {c.lower(): c for c in batch}
    columns: list[str] = []
    parts: list[str] = []
    for option, names in options.items():
        missing = [c for c in names or [] if c not in present]
        if not missing:
            continue
        columns += [c for c in missing if c not in columns]
        hints = [
            f"{c!r} (the batch has {lowered[c.lower()]!r}; names are case-sensitive)"
            for c in missing
            if c.lower() in lowered
        ]
        parts.append(
            f"option {option!r} names column(s) {', '.join(map(repr, missing))} not in the batch"
            + (f" [{'; '.join(hints)}]" if hints else "")
        )
    if columns:
        raise SchemaMismatchError(
            f"{'; '.join(parts)} (the batch's columns: {', '.join(batch)}); fix the option or "
            "add the column(s) to the stream",
            sink=sink,
            batch_id=batch_id,
            columns=columns,
        )


def variant_columns(schema: pa.Schema) -> list[tuple[str, str]]:
    """The columns of ``schema`` holding a Spark ``VARIANT``, each with the path of the
    variant inside it (``("s", "s.x")`` for a struct field): Spark's ``toArrow`` makes a
    variant ``struct<value: binary, metadata: binary>``, its ``metadata`` field marked
    ``variant: true``."""
    return _marked_columns(schema, _is_variant)


def geospatial_columns(schema: pa.Schema) -> list[tuple[str, str]]:
    """The columns of ``schema`` holding a Spark ``GEOMETRY`` or ``GEOGRAPHY`` (Spark 4.1+),
    each with the path of the value inside it: Spark's ``toArrow`` makes one a
    ``struct<srid: int32, wkb: binary>``, its ``wkb`` field marked ``geometry: true`` or
    ``geography: true``."""
    return _marked_columns(schema, _is_geospatial)


def _marked_columns(
    schema: pa.Schema, marked: Callable[[pa.StructType], bool]
) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for f in schema:
        for path in _marked_paths(f.type, f.name, marked):
            found.append((f.name, path))
    return found


def refuse_variants(schema: pa.Schema, *, sink: str, batch_id: int | None) -> None:
    """Raise :class:`fanout.errors.SchemaMismatchError` naming the batch's ``VARIANT``
    columns: delta-rs cannot write Delta's variant type, and would store each as a struct
    of two binaries without an error (readers then see no variant)."""
    from fanout.errors import SchemaMismatchError

    found = variant_columns(schema)
    if not found:
        return
    columns, where = _places(found)
    fixes = "; ".join(
        f"F.to_json(F.col({json.dumps(c, ensure_ascii=False)})) (in a sink's select: "
        f"to_json({_sql_name(c)}) AS {_sql_name(c)})"
        for c in columns
    )
    raise SchemaMismatchError(
        f"column(s) {where} hold a Spark VARIANT, which delta-rs cannot write as Delta's "
        "variant type (it would store struct<value: binary, metadata: binary>, which no "
        f"reader takes for a variant); write it as JSON text: {fixes}, or use engine "
        "'spark' (delta-spark writes variants)",
        sink=sink,
        batch_id=batch_id,
        columns=columns,
    )


def refuse_geospatial(schema: pa.Schema, *, sink: str, batch_id: int | None) -> None:
    """Raise :class:`fanout.errors.SchemaMismatchError` naming the batch's ``GEOMETRY`` and
    ``GEOGRAPHY`` columns: delta-rs would store each as the ``struct<srid, wkb>`` Spark's
    Arrow conversion makes of it, without an error (readers then see no geometry)."""
    from fanout.errors import SchemaMismatchError

    found = geospatial_columns(schema)
    if not found:
        return
    columns, where = _places(found)
    fixes = "; ".join(
        f"F.st_asbinary(F.col({json.dumps(name, ensure_ascii=False)})) (in a sink's select: "
        f"ST_AsBinary({_sql_name(name)}) AS {_sql_name(name)})"
        if path == name
        else f"ST_AsBinary of the value at {path}"
        for name, path in found
    )
    raise SchemaMismatchError(
        f"column(s) {where} hold a Spark GEOMETRY or GEOGRAPHY, which delta-rs cannot write "
        "as one (it would store struct<srid: int, wkb: binary>, which no reader takes for a "
        f"geometry); write its WKB as binary in the query: {fixes} (and its SRID, "
        "ST_SRID, in a column of its own when it matters)",
        sink=sink,
        batch_id=batch_id,
        columns=columns,
    )


def binary_partition_message(columns: Sequence[str]) -> str:
    """Why engine ``rs`` refuses partition ``columns`` of a binary type, and what to do."""
    names = ", ".join(map(repr, columns))
    fixes = "; ".join(f"hex({_sql_name(c)}) AS {_sql_name(c)}_hex" for c in columns)
    return (
        f"partition column(s) {names} are binary, which delta-rs writes as escaped text "
        "and reads back altered (b'a/b' is read back as b'\\u0061\\u002F\\u0062', "
        f"without an error); partition by its hex text instead (in a sink's select: {fixes}, "
        "then partition_by that column) or by another column, or use engine 'spark'"
    )


def refuse_binary_partitions(
    schema: pa.Schema, partition_by: Sequence[str] | None, *, sink: str, batch_id: int | None
) -> None:
    """Raise :class:`fanout.errors.SchemaMismatchError` naming the ``partition_by`` columns
    the batch holds as binary (engine ``rs``): see :func:`binary_partition_message`."""
    from fanout.errors import SchemaMismatchError

    found = binary_columns(schema, partition_by or [])
    if found:
        raise SchemaMismatchError(
            binary_partition_message(found), sink=sink, batch_id=batch_id, columns=found
        )


def binary_columns(schema: pa.Schema, names: Sequence[str]) -> list[str]:
    """The columns of ``names`` that ``schema`` holds as a binary type (any width)."""
    return [
        c
        for c in names
        if schema.get_field_index(c) >= 0
        and (_is_binary(schema.field(c).type) or pat.is_fixed_size_binary(schema.field(c).type))
    ]


def _places(found: list[tuple[str, str]]) -> tuple[list[str], str]:
    """The columns of ``found`` ((column, path) pairs), each once, and the text naming each
    place: ``'v'``, or ``'s' (at s.inner)`` for a value inside a column."""
    columns = list(dict.fromkeys(name for name, _ in found))
    where = ", ".join(
        repr(name) if path == name else f"{name!r} (at {path})" for name, path in found
    )
    return columns, where


def _marked_paths(
    kind: pa.DataType, path: str, marked: Callable[[pa.StructType], bool]
) -> list[str]:
    """The paths inside a column of type ``kind`` of the structs ``marked`` finds."""
    if pat.is_struct(kind):
        if marked(kind):
            return [path]
        return [p for c in kind for p in _marked_paths(c.type, f"{path}.{c.name}", marked)]
    if _is_list(kind):
        return _marked_paths(kind.value_type, f"{path}[]", marked)
    if pat.is_map(kind):
        return _marked_paths(kind.key_type, f"{path}.key", marked) + _marked_paths(
            kind.item_type, f"{path}.value", marked
        )
    if pat.is_dictionary(kind):
        return _marked_paths(kind.value_type, path, marked)
    return []


def _is_variant(kind: pa.StructType) -> bool:
    """Whether a struct is how Spark's Arrow conversion carries a ``VARIANT`` (the test of
    ``pyspark.sql.pandas.types.is_variant``)."""
    names = [f.name for f in kind]
    marked = any(
        f.name == "metadata" and (f.metadata or {}).get(b"variant") == b"true" for f in kind
    )
    return marked and "value" in names


def _is_geospatial(kind: pa.StructType) -> bool:
    """Whether a struct is how Spark's Arrow conversion carries a ``GEOMETRY`` or a
    ``GEOGRAPHY`` (the tests of ``pyspark.sql.pandas.types.is_geometry``/``is_geography``)."""
    names = [f.name for f in kind]
    marked = any(
        f.name == "wkb"
        and any((f.metadata or {}).get(k) == b"true" for k in (b"geometry", b"geography"))
        for f in kind
    )
    return marked and "srid" in names


def refuse_collated_keys(spark_schema: Any, keys: Sequence[str], *, sink: str,
                         batch_id: int | None) -> None:  # fmt: skip
    """Refuse merge ``keys`` that are Spark strings of a collation other than
    ``UTF8_BINARY`` (``spark_schema``: the batch DataFrame's schema). Spark compares them
    by the collation (``'A'`` and ``'a'`` are one key under ``UTF8_LCASE``), but their
    Arrow values carry none: delta-rs' MERGE and the batch's deduplication compare bytes,
    and would keep a row for each spelling of what the query calls one key."""
    from fanout.errors import SchemaMismatchError

    fields = {f.name: f.dataType for f in getattr(spark_schema, "fields", [])}
    collated = [
        (k, str(getattr(fields.get(k), "collation", None)))
        for k in keys
        if getattr(fields.get(k), "collation", "UTF8_BINARY") not in ("UTF8_BINARY", None)
    ]
    if not collated:
        return
    listed = ", ".join(f"{k!r} (collation {c})" for k, c in collated)
    fixes = ", ".join(f"F.lower(F.col({k!r})).alias({k!r})" for k, _ in collated)
    raise SchemaMismatchError(
        f"merge key column(s) {listed} compare by their collation in Spark, but delta-rs "
        "merges by the exact string: rows Spark calls one key would stay several rows in "
        f"the table. Make the key one spelling in the stream (e.g. {fixes}), or cast it "
        "to a plain string (collation UTF8_BINARY) if its spellings are distinct keys",
        sink=sink,
        batch_id=batch_id,
        columns=[k for k, _ in collated],
    )
