"""Ties on a Delta merge's ``order_by`` have one winner whatever the arrival order
(issue 13, item 8): the greatest ``order_by`` wins, then the greatest value of each other
column in batch column order (nulls lose). A replay delivering the rows in another order
must not pick another row."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from fanout_delta.merge import prepare_merge_source

from fanout.errors import SinkWriteError

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


NAN = float("nan")
FLOAT_SCHEMA = pa.schema([("id", pa.float64()), ("seq", pa.float64()), ("amount", pa.float64())])
FLOAT_ROWS = [
    {"id": 0.0, "seq": 1.0, "amount": 1.0},
    {"id": -0.0, "seq": 2.0, "amount": 2.0},  # wins key 0.0 (one key with 0.0), as it is
    {"id": NAN, "seq": 1.0, "amount": 3.0},
    {"id": NAN, "seq": NAN, "amount": 4.0},  # wins key NaN: NaN is the greatest seq
    {"id": 1.0, "seq": 5.0, "amount": 5.0},  # wins key 1.0: a null seq loses
    {"id": 1.0, "seq": None, "amount": 6.0},
    {"id": 2.0, "seq": 7.0, "amount": 100.0},
    {"id": 2.0, "seq": 7.0, "amount": NAN},  # wins the tie on seq: NaN is the greatest
]
FLOAT_WINNERS = sorted(map(str, [FLOAT_ROWS[1], FLOAT_ROWS[3], FLOAT_ROWS[4], FLOAT_ROWS[7]]))
"""The winners as text: ``nan != nan``, and ``-0.0 == 0.0`` would hide the sign kept."""


@pytest.mark.parametrize("order", ["forward", "backward", "shuffled"])
def test_float_keys_and_nan_order_as_in_spark(order: str) -> None:
    """``0.0`` and ``-0.0`` are one key, and so are all NaNs (as the MERGE's ``t.k = s.k``
    and Spark match them); NaN is the greatest ``order_by`` value and the greatest value
    of a column breaking a tie, as Spark orders it (Arrow sorts it first). The winning
    rows keep the batch's values."""
    arrived = {"forward": FLOAT_ROWS, "backward": FLOAT_ROWS[::-1],
               "shuffled": FLOAT_ROWS[3:] + FLOAT_ROWS[:3]}[order]  # fmt: skip
    data = pa.Table.from_pylist(arrived, schema=FLOAT_SCHEMA)

    kept = prepare_merge_source(data, ["id"], ["seq"], "s", 0)

    assert sorted(map(str, kept.to_pylist())) == FLOAT_WINNERS


@pytest.mark.parametrize("order", ["forward", "backward"])
def test_nan_payloads_are_one_key_and_a_zero_s_sign_decides_last(order: str) -> None:
    """NaNs of other bits (a computed NaN, a float32 one) are the key NaN too; rows
    equal but for the sign of a zero (equal to Spark too) have one winner in any arrival
    order, by the bits (``0.0`` over ``-0.0``), not the first or last to arrive."""
    import struct

    other_nan = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000000))[0]
    rows = [
        {"id": NAN, "seq": 1.0, "amount": 1.0},
        {"id": other_nan, "seq": 2.0, "amount": 2.0},
        {"id": 3.0, "seq": 0.0, "amount": -0.0},
        {"id": 3.0, "seq": -0.0, "amount": 0.0},
    ]
    if order == "backward":
        rows = rows[::-1]
    schema = pa.schema([("id", pa.float32()), ("seq", pa.float64()), ("amount", pa.float64())])
    data = pa.Table.from_pylist(rows, schema=schema)

    kept = prepare_merge_source(data, ["id"], ["seq"], "s", 0)

    assert sorted(map(str, kept.to_pylist())) == [
        "{'id': 3.0, 'seq': 0.0, 'amount': -0.0}",
        "{'id': nan, 'seq': 2.0, 'amount': 2.0}",
    ]
    nans = data.filter(pc.is_nan(data.column("id"))).select(["id", "amount"])
    assert sorted(nans.column("id").combine_chunks().view(pa.int32()).to_pylist()) == [
        -4194304,  # 0xFFC00000
        2143289344,  # 0x7FC00000
    ]
    with pytest.raises(SinkWriteError) as duplicated:
        prepare_merge_source(nans, ["id"], None, "s", 0)
    assert str(duplicated.value) == (
        "sink 's', batch 0: 1 key(s) occur more than once in the batch, e.g. {'id': nan} (2 "
        "rows); a MERGE takes one row per key. Set order_by to the column(s) whose greatest "
        "value wins (e.g. an event time or sequence number), or deduplicate the stream."
    )


@pytest.mark.parametrize("order", ["forward", "backward"])
def test_a_zero_key_s_sign_in_the_table_does_not_depend_on_arrival_order(
    tmp_path, order: str
) -> None:
    """Two rows of the key ``0.0`` (one ``0.0``, one ``-0.0``, one key to Spark and to the
    MERGE) tied on every other column: the row merged into the table, and so the key's
    sign there, is the same whatever order a replay delivers them in (``0.0``)."""
    import math

    from arrow_batches import batch_of
    from fanout_delta import DeltaSink

    from fanout.contract.sink import SinkContext
    from fanout.delta_tables.io import read_delta

    rows = [{"id": 0.0, "seq": 1, "name": "a"}, {"id": -0.0, "seq": 1, "name": "a"}]
    if order == "backward":
        rows = rows[::-1]
    schema = pa.schema([("id", pa.float64()), ("seq", pa.int64()), ("name", pa.string())])
    sink = DeltaSink(name="s", path=str(tmp_path / "t"), mode="merge", keys=["id"],
                     order_by=["seq"])  # fmt: skip
    sink.open(SinkContext(pipeline="p"))

    sink.write(batch_of(pa.Table.from_pylist(rows, schema=schema), 0))

    written = read_delta(str(tmp_path / "t")).to_pylist()
    assert [(math.copysign(1.0, r["id"]), r["seq"], r["name"]) for r in written] == [(1.0, 1, "a")]
