"""Rows a Delta table's constraints refuse (a CHECK constraint, a NOT NULL column) fail the
batch with an error naming the sink, the batch, the table's constraints and the rows (as
delta-rs previews them), and saying what to do: delta-rs' own message names neither the
constraint nor the column. Nothing of the batch is written."""

from __future__ import annotations

import pyarrow as pa
import pytest
from arrow_batches import batch_of
from deltalake import DeltaTable, Field, Schema, write_deltalake
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
    "stream (a route's 'where' sends them to the dead letters), or change the table's "
    "constraints. delta-rs: "
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
