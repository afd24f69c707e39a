"""A ``float`` (32-bit) column is written with the shortest digits of its own precision,
as Spark's ``to_json`` and ``CAST(f AS STRING)`` write it: ``0.1``. Both encoders widened
it to a double first and wrote that double's digits, ``0.10000000149011612``: a value
the query never showed, in values, keys and headers alike."""

from __future__ import annotations

import pyarrow as pa
from fanout_kafka.records import Encoder, Record


def _encoded(batch: pa.RecordBatch, key: str = "id", headers: tuple[str, ...] = ()) -> list[Record]:
    good, bad = Encoder((key,), None, headers, (), 10_000).encode_arrow([batch])
    assert bad == []
    return good


def test_a_float_column_is_written_with_its_own_shortest_digits() -> None:
    floats = pa.array([0.1, 16777217.0, None, float("nan"), 3.4028235e38], pa.float32())
    batch = pa.RecordBatch.from_arrays([pa.array([1, 2, 3, 4, 5]), floats], ["id", "f"])
    assert [r.value for r in _encoded(batch)] == [
        b'{"id":1,"f":0.1}', b'{"id":2,"f":16777216.0}', b'{"id":3,"f":null}',
        b'{"id":4,"f":"NaN"}', b'{"id":5,"f":3.4028235e+38}',
    ]  # fmt: skip


def test_a_nested_float_and_a_float_key_or_header_too() -> None:
    kind = pa.struct([("a", pa.float32()), ("b", pa.list_(pa.float32()))])
    nested = pa.array([{"a": 0.1, "b": [0.3, None]}], kind)
    key = pa.array([0.7], pa.float32())
    batch = pa.RecordBatch.from_arrays([key, nested, pa.array([0.2], pa.float32())],
                                       ["k", "n", "h"])  # fmt: skip
    assert _encoded(batch, "k", ("h",)) == [
        Record(b"0.7", b'{"k":0.7,"n":{"a":0.1,"b":[0.3,null]},"h":0.2}', [("h", b"0.2")])
    ]
