"""Ties on a Delta merge's ``order_by`` have one winner whatever the arrival order
(issue 13, item 8): the greatest ``order_by`` wins, then the greatest value of each other
column in batch column order (nulls lose). A replay delivering the rows in another order
must not pick another row."""

from __future__ import annotations

import pyarrow as pa
import pytest
from fanout_delta.merge import prepare_merge_source

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("seq", pa.int64()),
        ("name", pa.string()),
        ("tags", pa.list_(pa.string())),
        ("amount", pa.float64()),
    ]
)
ROWS = [
    {"id": 1, "seq": 5, "name": "a", "tags": ["x"], "amount": 9.0},
    {"id": 1, "seq": 5, "name": "b", "tags": ["x"], "amount": 1.0},  # wins on name
    {"id": 1, "seq": 4, "name": "z", "tags": ["z"], "amount": 99.0},  # older seq: never
    {"id": 2, "seq": 3, "name": "c", "tags": ["a", "b"], "amount": 2.0},
    {"id": 2, "seq": 3, "name": "c", "tags": ["b"], "amount": 1.0},  # wins on tags (a list)
    {"id": 3, "seq": 1, "name": None, "tags": None, "amount": 5.0},
    {"id": 3, "seq": 1, "name": "n", "tags": None, "amount": 4.0},  # wins: a null name loses
]
WINNERS = [ROWS[1], ROWS[4], ROWS[6]]


@pytest.mark.parametrize("order", ["forward", "backward", "shuffled"])
def test_tie_winner_does_not_depend_on_arrival_order(order: str) -> None:
    arrived = {"forward": ROWS, "backward": ROWS[::-1], "shuffled": ROWS[3:] + ROWS[:3]}[order]
    data = pa.Table.from_pylist(arrived, schema=SCHEMA)

    kept = prepare_merge_source(data, ["id"], ["seq"], "s", 0)

    assert sorted(kept.to_pylist(), key=lambda r: r["id"]) == WINNERS
    assert kept.schema == SCHEMA


def test_a_batch_without_ties_turns_no_column_into_text(monkeypatch) -> None:
    """The tie-break costs nothing when no key ties on ``order_by`` (most batches):
    nested columns become JSON text, a Python loop over every row (~1 s per 200k rows),
    only for a batch that needs the tie-break."""
    from fanout_delta import merge

    def no_text(column):
        raise AssertionError("a batch without ties converted a column to JSON text")

    monkeypatch.setattr(merge, "_as_json_text", no_text)
    rows = [ROWS[0], ROWS[2], ROWS[3], ROWS[5]]  # id 1 twice, on different seq: no tie
    data = pa.Table.from_pylist(rows, schema=SCHEMA)

    kept = prepare_merge_source(data, ["id"], ["seq"], "s", 0)

    assert sorted(kept.to_pylist(), key=lambda r: r["id"]) == [ROWS[0], ROWS[3], ROWS[5]]


@pytest.mark.parametrize("order", ["forward", "backward"])
def test_ties_with_a_dictionary_encoded_column(order: str) -> None:
    """Arrow cannot sort dictionary-encoded columns; the tie-break sorts their values."""
    data = pa.table(
        {
            "id": [1, 1, 2],
            "seq": [5, 5, 1],
            "name": pa.array(["b", "a", "c"]).dictionary_encode(),
        }
    )
    if order == "backward":
        data = data.take([2, 1, 0])

    kept = prepare_merge_source(data, ["id"], ["seq"], "s", 0)

    assert sorted(kept.to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "seq": 5, "name": "b"},
        {"id": 2, "seq": 1, "name": "c"},
    ]
