"""A partition's rows on the executor: their numbering, and the check that no key occurs
twice (which decides whether the cheaper MERGE may run)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from fanout_postgres.encode import Rows
from fanout_postgres.statements import ROW
from fanout_postgres.transaction import _unique


def test_rows_are_numbered_across_chunks_in_arrival_order() -> None:
    batches = [pa.record_batch({"id": [7, 8, 9]}), pa.record_batch({"id": [1, 2]})]
    rows = Rows(iter(batches))
    table = rows.table()
    assert table.column(ROW).type == pa.int32()
    assert table.column(ROW).to_pylist() == [0, 1, 2, 3, 4]
    assert table.column("id").to_pylist() == [7, 8, 9, 1, 2]
    assert rows.count == 5


@pytest.mark.parametrize(
    ("columns", "keys", "unique"),
    [
        ({"id": [3, 1, 2]}, ("id",), True),
        ({"id": [3, 1, 3]}, ("id",), False),
        ({"id": [2**62, -(2**62), 2**62]}, ("id",), False),
        ({"id": [1, None, 2]}, ("id",), True),
        ({"id": [1, None, None]}, ("id",), False),
        ({"code": ["a", "b", "A"]}, ("code",), True),
        ({"code": ["a", "b", "a"]}, ("code",), False),
        ({"a": [1, 1, 2], "b": ["x", "y", "x"]}, ("a", "b"), True),
        ({"a": [1, 1, 2], "b": ["x", "x", "x"]}, ("a", "b"), False),
    ],
)
def test_unique_keys(columns: dict[str, list[object]], keys: tuple[str, ...], unique: bool) -> None:
    table = pa.table(columns)
    assert _unique(table, keys) is unique
    chunked = pa.concat_tables([table.slice(0, 1), table.slice(1)])
    assert _unique(chunked, keys) is unique
