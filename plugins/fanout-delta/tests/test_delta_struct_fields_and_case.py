"""A batch whose struct lacks a field of the table's struct, and column names that differ
only in case, met alike by the driver's writer (delta-rs) and the executors' writer (run
in this process by the Arrow batches, the code a Spark task runs).

- An append writes a missing nullable field as null, as Delta on Spark does (and as it
  writes a missing column); a missing NOT NULL field is refused, and, with delta-rs, any
  missing field of a merge.
- Delta names are case-insensitive: ``Id`` and ``id`` in one batch, or a batch ``ID``
  against a table ``id``, are refused naming both spellings, before anything is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from arrow_batches import batch_of, opened
from deltalake import write_deltalake

from fanout.delta_tables.io import read_delta
from fanout.errors import SchemaMismatchError

AB = pa.struct([("a", pa.int64()), ("b", pa.string())])
A = pa.struct([("a", pa.int64())])
WRITE_FROM = pytest.mark.parametrize("write_from", ["driver", "executors"])


def rows(path: Path) -> list[dict[str, Any]]:
    return sorted(read_delta(str(path)).to_pylist(), key=lambda r: r["id"])


def versions(path: Path) -> int:
    return len(list((path / "_delta_log").glob("*.json")))


# -- a struct missing a field ---------------------------------------------------------------


@WRITE_FROM
def test_an_append_writes_a_struct_field_the_batch_lacks_as_null(tmp_path, write_from):
    """Before, delta-rs (the driver) refused the batch ("number of fields does not match")
    while the executors' writer wrote it with nulls."""
    path = tmp_path / "t"
    sink = opened(path, write_from=write_from)
    full = pa.table(
        {
            "id": pa.array([1], pa.int64()),
            "s": pa.array([{"a": 1, "b": "x"}], AB),
            "l": pa.array([[{"a": 1, "b": "x"}]], pa.list_(AB)),
        }
    )
    short = pa.table(
        {
            "id": pa.array([2], pa.int64()),
            "s": pa.array([{"a": 2}], A),
            "l": pa.array([[{"a": 2}, None]], pa.list_(A)),
        }
    )
    sink.write(batch_of(full, 0))

    result = sink.write(batch_of(short, 1))

    assert result.rows == 1
    assert rows(path) == [
        {"id": 1, "s": {"a": 1, "b": "x"}, "l": [{"a": 1, "b": "x"}]},
        {"id": 2, "s": {"a": 2, "b": None}, "l": [{"a": 2, "b": None}, None]},
    ]
    assert read_delta(str(path)).schema.field("s").type == AB


@WRITE_FROM
def test_an_append_refuses_a_struct_lacking_a_not_null_field(tmp_path, write_from):
    path = tmp_path / "t"
    required = pa.struct([("a", pa.int64()), pa.field("b", pa.string(), nullable=False)])
    schema = pa.schema([("id", pa.int64()), ("s", required)])
    write_deltalake(str(path), pa.table({"id": [1], "s": [{"a": 1, "b": "x"}]}, schema))
    sink = opened(path, write_from=write_from)
    short = pa.table({"id": pa.array([2], pa.int64()), "s": pa.array([{"a": 2}], A)})

    with pytest.raises(SchemaMismatchError) as raised:
        sink.write(batch_of(short, 1))

    assert str(raised.value) == (
        "sink 's', batch 1: the batch does not fit the Delta table: field(s) 's.b' of the "
        "table missing from the batch's struct(s) (they are NOT NULL in the table); add "
        "them to the struct in the stream, e.g. F.struct(..., "
        "F.lit(None).cast('<type>').alias('<field>')) for a null"
    )
    assert raised.value.columns == ["s"]
    assert versions(path) == 1


def test_a_merge_refuses_a_struct_lacking_a_field(tmp_path):
    """delta-rs cannot plan it (before: "type_coercion ... Failed to coerce then")."""
    path = tmp_path / "t"
    sink = opened(path, mode="merge", keys=["id"])
    first = pa.table({"id": pa.array([1], pa.int64()), "s": pa.array([{"a": 1, "b": "x"}], AB)})
    sink.write(batch_of(first, 0))
    short = pa.table({"id": pa.array([1, 2], pa.int64()), "s": pa.array([{"a": 3}, {"a": 4}], A)})

    with pytest.raises(SchemaMismatchError) as raised:
        sink.write(batch_of(short, 1))

    assert str(raised.value) == (
        "sink 's', batch 1: the batch does not fit the Delta table: field(s) 's.b' of the "
        "table missing from the batch's struct(s) (a merge with delta-rs cannot update a "
        "struct without all its fields); add them to the struct in the stream, e.g. "
        "F.struct(..., F.lit(None).cast('<type>').alias('<field>')) for a null"
    )
    assert rows(path) == [{"id": 1, "s": {"a": 1, "b": "x"}}]


# -- names that differ only in case ---------------------------------------------------------


@WRITE_FROM
def test_a_batch_holding_two_names_differing_in_case_is_refused(tmp_path, write_from):
    """Before, delta-rs failed with "Schema error: Duplicate field name (case-insensitive)",
    naming no sink column to rename."""
    path = tmp_path / "t"
    sink = opened(path, write_from=write_from)
    table = pa.table(
        {
            "Id": pa.array([1], pa.int64()),
            "id": pa.array([2], pa.int64()),
            "s": pa.array([{"A": 1, "a": 2}], pa.struct([("A", pa.int64()), ("a", pa.int64())])),
        }
    )

    with pytest.raises(SchemaMismatchError) as raised:
        sink.write(batch_of(table))

    assert str(raised.value) == (
        "sink 's', batch 0: the batch holds 'Id' and 'id', 's.A' and 's.a', names that "
        "differ only in case: Delta column names are case-insensitive, so a Delta table "
        "cannot hold both; rename or drop one of each pair in the stream (e.g. in a sink's "
        "select: id AS id_2)"
    )
    assert raised.value.columns == ["Id", "id", "s"]
    assert not path.exists()


@WRITE_FROM
@pytest.mark.parametrize("merge_schema", [False, True])
def test_a_batch_spelling_a_table_column_in_another_case_is_refused(
    tmp_path, write_from, merge_schema
):
    """Before: without merge_schema, refused as a column not in the table ("names are
    case-sensitive"); with it, delta-rs failed ("Duplicate field name (case-insensitive)")."""
    path = tmp_path / "t"
    sink = opened(path, write_from=write_from, merge_schema=merge_schema)
    first = pa.table({"id": pa.array([1], pa.int64()), "s": pa.array([{"a": 1}], A)})
    sink.write(batch_of(first, 0))
    other = pa.table(
        {"ID": pa.array([2], pa.int64()), "s": pa.array([{"A": 2}], pa.struct([("A", pa.int64())]))}
    )

    with pytest.raises(SchemaMismatchError) as raised:
        sink.write(batch_of(other, 1))

    assert str(raised.value) == (
        "sink 's', batch 1: the batch spells 'ID' (the table has 'id'), 's.A' (the table has "
        "'s.a') in another case: Delta column names are case-insensitive, so these name the "
        "table's column, which the sink writes only under the table's spelling (delta-rs "
        "cannot write it from another, nor add it as a new one, with merge_schema too; every "
        "engine refuses alike); rename them in the stream to the table's spelling (in a sink's "
        "select: ID AS id, A AS a)"
    )
    assert raised.value.columns == ["ID", "s"]
    assert rows(path) == [{"id": 1, "s": {"a": 1}}]
    assert read_delta(str(path)).schema.names == ["id", "s"]
