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
        b'{"id":1,"f":0.1}', b'{"id":2,"f":1.6777216E7}', b'{"id":3,"f":null}',
        b'{"id":4,"f":"NaN"}', b'{"id":5,"f":3.4028235E38}',
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


DOUBLES = [  # value, Spark's CAST(value AS STRING) (tests/integration/test_spark_text.py)
    (1e20, "1.0E20"), (1e-4, "1.0E-4"), (12345678.0, "1.2345678E7"), (5e-324, "4.9E-324"),
    (2.0**53, "9.007199254740992E15"), (0.001, "0.001"), (-0.0, "-0.0"), (1e-7, "1.0E-7"),
    (123456789.123, "1.23456789123E8"), (100.0, "100.0"), (float("-inf"), "-Infinity"),
]  # fmt: skip


def test_a_double_is_spelled_as_spark_casts_it_in_values_keys_and_headers() -> None:
    """A double is Spark's text (Java's ``Double.toString``), column-wise and row by row,
    in values, nested values, keys and headers: Python's JSON wrote ``1e+20``, ``0.0001``,
    ``12345678.0``, ``5e-324`` (the same values, not the same text as Spark's and the
    PostgreSQL sink's)."""
    values = pa.array([v for v, _ in DOUBLES], pa.float64())
    ids = pa.array(range(len(DOUBLES)))
    texts = [t if t[-1].isdigit() else f'"{t}"' for _, t in DOUBLES]  # JSON quotes -Infinity
    flat = pa.RecordBatch.from_arrays([ids, values], ["id", "d"])
    assert [r.value for r in _encoded(flat)] == [  # column-wise (fanout_kafka.vector)
        f'{{"id":{i},"d":{t}}}'.encode() for i, t in enumerate(texts)
    ]
    nested = pa.array([[v] for v, _ in DOUBLES], pa.list_(pa.float64()))
    rows = pa.RecordBatch.from_arrays([values, nested], ["d", "n"])
    assert _encoded(rows, "d", ("d",)) == [  # row by row (a float key, a header, a list)
        Record(s.encode(), f'{{"d":{t},"n":[{t}]}}'.encode(), [("d", s.encode())])
        for (_, s), t in zip(DOUBLES, texts, strict=True)
    ]


def test_a_nested_key_or_header_spells_its_floats_as_the_value_does() -> None:
    """A key or header column of an array or a struct is its JSON text, floats in it
    Spark's text and a NaN or an infinity quoted, as in the record's value: it was Python's
    JSON (``[1e+20,NaN]``: not Spark's spelling, and not JSON at all with a NaN)."""
    kind = pa.struct([("x", pa.float64())])
    key = pa.array([[1e20, float("nan")]], pa.list_(pa.float64()))
    header = pa.array([{"x": 1e-5}], kind)
    batch = pa.RecordBatch.from_arrays([key, header], ["k", "h"])
    assert _encoded(batch, "k", ("h",)) == [
        Record(
            b'[1.0E20,"NaN"]',
            b'{"k":[1.0E20,"NaN"],"h":{"x":1.0E-5}}',
            [("h", b'{"x":1.0E-5}')],
        )
    ]


def test_a_subnormal_float_keeps_the_two_digits_spark_writes() -> None:
    """A subnormal ``float`` whose shortest text has one digit (``1e-45``) is spelled by
    Java with the two closest to its exact value: ``1.4E-45`` (Spark's ``CAST`` and
    ``to_json``, tests/integration/test_spark_text.py). Widened to the double of its
    shortest text, ``1e-45``, it was written ``1.0E-45``, at the top level and nested."""
    floats = pa.array([1.4e-45, 4.2e-45, 7e-45, -2.8e-45], pa.float32())
    nested = pa.array([[v] for v in floats.to_pylist()], pa.list_(pa.float32()))
    batch = pa.RecordBatch.from_arrays([floats, nested], ["f", "n"])
    texts = ["1.4E-45", "4.2E-45", "7.0E-45", "-2.8E-45"]
    assert _encoded(batch, "f") == [
        Record(t.encode(), f'{{"f":{t},"n":[{t}]}}'.encode(), []) for t in texts
    ]
