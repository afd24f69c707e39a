"""Rows a Delta table's constraints refuse (a CHECK constraint, a NOT NULL column) in a
batch that is no Spark DataFrame (the constraints are evaluated in Spark:
``test_delta_constraint_letters.py``) are left to delta-rs' own check: they fail the batch
with an error naming the sink, the batch, the table's constraints and the rows (as delta-rs
previews them), and saying what to do: delta-rs' own message names neither the constraint
nor the column. Nothing of the batch is written."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from arrow_batches import batch_of
from deltalake import DeltaTable, Field, Schema, write_deltalake
from deltalake.schema import ArrayType
from fanout_delta import DeltaSink

from fanout.contract.sink import SinkContext
from fanout.delta_tables.io import read_delta
from fanout.errors import SinkWriteError

WAYS = [
    pytest.param({"write_from": "driver"}, id="append-driver"),
    pytest.param({"write_from": "executors"}, id="append-executors"),
    pytest.param({"mode": "merge", "keys": ["id"]}, id="merge"),
]
WHAT_TO_DO = (
    "nothing was written and every replay fails alike: fix or filter those rows in the "
    "stream (a route's 'where' sends them to the dead letters; a merge updating a generated "
    "column's inputs must carry its value), or change the table's constraints. delta-rs: "
)


def opened(path: str, **options) -> DeltaSink:
    sink = DeltaSink(name="s", path=path, **options)
    sink.open(SinkContext(pipeline="p"))
    return sink


@pytest.mark.parametrize("options", WAYS)
def test_a_row_breaking_a_check_constraint_names_the_constraint(tmp_path, options) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": pa.array([1], pa.int64()), "x": [5]}))
    DeltaTable(path).alter.add_constraint({"x_pos": "x > 0"})
    sink = opened(path, **options)

    with pytest.raises(SinkWriteError) as refused:
        sink.write(batch_of(pa.table({"id": pa.array([2, 3], pa.int64()), "x": [7, -1]}), 0))

    message = str(refused.value)
    assert message.startswith(
        f"sink 's', batch 0: rows of the batch break the constraints of the Delta table "
        f"{path} (CHECK x_pos (x > 0)); " + WHAT_TO_DO
    ), message
    assert "| 3  | -1 |" in message  # delta-rs' preview of the refused row
    assert read_delta(path).to_pylist() == [{"id": 1, "x": 5}]


@pytest.mark.parametrize("options", [WAYS[0], WAYS[2]])
def test_a_null_in_a_not_null_column_names_the_column(tmp_path, options) -> None:
    path = str(tmp_path / "t")
    DeltaTable.create(path, Schema([Field("id", "long"), Field("x", "long", nullable=False)]))
    sink = opened(path, **options)

    with pytest.raises(SinkWriteError) as refused:
        sink.write(batch_of(pa.table({"id": pa.array([2, 3], pa.int64()), "x": [7, None]}), 0))

    message = str(refused.value)
    assert message.startswith(
        f"sink 's', batch 0: rows of the batch break the constraints of the Delta table "
        f"{path} (NOT NULL 'x'); " + WHAT_TO_DO
    ), message
    assert read_delta(path).to_pylist() == []


def test_an_invariant_and_an_array_without_null_elements_are_named(tmp_path) -> None:
    """delta-rs refuses a row breaking a column's invariant (``delta.invariants``) or
    holding a null element in an array whose elements may not be null: the error named
    neither ("none found")."""
    path = str(tmp_path / "t")
    invariant = {"delta.invariants": json.dumps({"expression": {"expression": "x > 0"}})}
    DeltaTable.create(
        path,
        Schema([Field("id", "long"), Field("x", "long", metadata=invariant),
                Field("arr", ArrayType("long", contains_null=False))]),
    )  # fmt: skip
    sink = opened(path, write_from="driver")
    batch = pa.table({"id": pa.array([2], pa.int64()), "x": pa.array([-1], pa.int64()),
                      "arr": pa.array([[1]], pa.list_(pa.int64()))})  # fmt: skip

    with pytest.raises(SinkWriteError) as refused:
        sink.write(batch_of(batch, 0))

    assert str(refused.value).startswith(
        f"sink 's', batch 0: rows of the batch break the constraints of the Delta table "
        f"{path} (invariant of 'x' (x > 0), NOT NULL elements of 'arr'); " + WHAT_TO_DO
    ), str(refused.value)
    assert read_delta(path).num_rows == 0


def generated_table(path: str) -> None:
    """A table whose column ``g`` is generated as ``x * 2``, with a nullable ``note``."""
    DeltaTable.create(
        path,
        Schema(
            [
                Field("id", "long"),
                Field("x", "long"),
                Field("g", "long", metadata={"delta.generationExpression": "x * 2"}),
                Field("note", "string"),
            ]
        ),
    )


@pytest.mark.parametrize("options", [WAYS[0], WAYS[1]])
def test_an_append_lacking_a_generated_column_gets_it_computed(tmp_path, options) -> None:
    """A batch without the generated column (nor the nullable ``note``) is appended with
    it computed, as delta-rs does: padded with nulls first, it broke the generation
    expression and every append to such a table failed. (The executors step back to
    the driver's writer for a generated column.)"""
    path = str(tmp_path / "t")
    generated_table(path)
    sink = opened(path, **options)

    sink.write(batch_of(pa.table({"id": pa.array([1, 2], pa.int64()), "x": [7, 8]}), 0))

    assert sorted(read_delta(path).to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "x": 7, "g": 14, "note": None},
        {"id": 2, "x": 8, "g": 16, "note": None},
    ]


def test_a_merge_updating_a_generated_column_s_inputs_names_the_column(tmp_path) -> None:
    """delta-rs' MERGE inserts a generated column computed but updates a row keeping its
    old value, which then breaks the expression: the error names the column and its
    expression. A batch carrying the column's value merges."""
    path = str(tmp_path / "t")
    generated_table(path)
    sink = opened(path, mode="merge", keys=["id"])
    sink.write(batch_of(pa.table({"id": pa.array([1, 2], pa.int64()), "x": [7, 8]}), 0))

    with pytest.raises(SinkWriteError) as refused:
        sink.write(batch_of(pa.table({"id": pa.array([2, 3], pa.int64()), "x": [50, 60]}), 1))

    message = str(refused.value)
    assert message.startswith(
        f"sink 's', batch 1: rows of the batch break the constraints of the Delta table "
        f"{path} (GENERATED 'g' AS (x * 2)); " + WHAT_TO_DO
    ), message
    carried = {"id": pa.array([2, 3], pa.int64()), "x": [50, 60], "g": pa.array([100, 120])}
    sink.write(batch_of(pa.table(carried), 1))
    assert sorted(read_delta(path).to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "x": 7, "g": 14, "note": None},
        {"id": 2, "x": 50, "g": 100, "note": None},
        {"id": 3, "x": 60, "g": 120, "note": None},
    ]
