"""A Spark float or double written to a text column is the text Spark's ``CAST(x AS
STRING)`` gives (Java's ``Double.toString``/``Float.toString``): ``1.0``, ``1.0E20``,
``1.0E-4``, ``Infinity``, ``NaN``, never Arrow's ``1``, ``1e+20``, ``0.0001``, ``inf``,
``nan``, which the CSV ``COPY`` sent; a ``double precision`` or ``real`` column, which
reads every spelling, holds the same value either way.

Driven through the partition writer (a real plan from a real server, Arrow rows, no Spark).
The expected texts are what a Spark 4.2 session printed for ``CAST(x AS STRING)``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
from fanout_postgres import PostgresSink
from fanout_postgres.task import PostgresPartitionWriter
from fanout_postgres.transaction import BatchMeta
from pgcheck import execute, query
from pyspark.sql import types as T
from write_plan import write_plan

from fanout.partitioned.membership import MemberDigest
from fanout.partitioned.task import CommitHooks
from fanout.testing import open_sink

INF, NAN = float("inf"), float("nan")
DOUBLES = {  # value: Spark 4.2's CAST(value AS STRING)
    1.0: "1.0", 0.1: "0.1", 100.0: "100.0", 4.35: "4.35", 9999999.0: "9999999.0",
    0.001: "0.001", -0.0: "-0.0", 1e20: "1.0E20", 1e7: "1.0E7", 1e-5: "1.0E-5",
    0.0001: "1.0E-4", 123456789.0: "1.23456789E8", 1.2345678901234567e-7: "1.2345678901234566E-7",
    1.7976931348623157e308: "1.7976931348623157E308", 5e-324: "4.9E-324", INF: "Infinity",
    -INF: "-Infinity", NAN: "NaN",
}  # fmt: skip
FLOATS = [  # float32 values (as their nearest double), Spark 4.2's CAST(CAST(x AS FLOAT) AS STRING)
    (0.1, "0.1"), (1.1, "1.1"), (1.0, "1.0"), (0.001, "0.001"), (3.3333333, "3.3333333"),
    (1e10, "1.0E10"), (1e-5, "1.0E-5"), (16777216.0, "1.6777216E7"), (1e7, "1.0E7"),
    (3.4028235e38, "3.4028235E38"), (1.4e-45, "1.4E-45"), (INF, "Infinity"), (NAN, "NaN"),
]  # fmt: skip


def test_floats_into_text_columns_are_spelled_as_spark_casts_them(pg_url: str) -> None:
    execute(
        pg_url,
        "CREATE TABLE nums (id bigint PRIMARY KEY, d text, f text, d8 double precision, f4 real)",
    )
    schema = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField("d", T.DoubleType()),
         T.StructField("f", T.FloatType()), T.StructField("d8", T.DoubleType()),
         T.StructField("f4", T.FloatType())]
    )  # fmt: skip
    sink = open_sink(PostgresSink("pg", url=pg_url, table="nums"), "flt")
    writer = PostgresPartitionWriter(sink.connection_url(), write_plan(sink, schema, 0),
                                     BatchMeta("flt", 0, "q"), True, 0.0)  # fmt: skip
    n = max(len(DOUBLES), len(FLOATS))
    doubles = pa.array(list(DOUBLES) + [None] * (n - len(DOUBLES)), pa.float64())
    floats = pa.array([v for v, _ in FLOATS] + [None] * (n - len(FLOATS)), pa.float32())
    rows = pa.table({"id": pa.array(range(n), pa.int64()), "d": doubles, "f": floats,
                     "d8": doubles, "f4": floats})  # fmt: skip
    outcome = writer.write_partition(
        0, iter(rows.to_batches()), CommitHooks("flt", "pg", 0), MemberDigest()
    )
    assert (outcome.status, outcome.rows) == ("committed", n), outcome.failure
    stored = query(pg_url, "SELECT d, f, d8, f4 FROM nums ORDER BY id")
    texts = list(DOUBLES.values()) + [None] * (n - len(DOUBLES))
    float_texts = [t for _, t in FLOATS] + [None] * (n - len(FLOATS))
    assert [(d, f) for d, f, _, _ in stored] == list(zip(texts, float_texts, strict=True))

    def same(a: float | None, b: float | None, kind: type = float) -> bool:
        if a is None or b is None:
            return a is b
        return kind(a) == kind(b) or (math.isnan(a) and math.isnan(b))

    # the float columns hold the very values (the driver reads a real as its shortest text)
    assert all(same(s[2], v) for s, v in zip(stored, doubles.to_pylist(), strict=True))
    assert all(same(s[3], v, np.float32) for s, v in zip(stored, floats.to_pylist(), strict=True))


def test_nested_values_are_spark_s_to_json(spark: Any) -> None:
    """A struct, list or map value written to a ``json`` column is Spark's ``to_json`` of it
    (keeping a null field, as ``ignoreNullFields`` false does) but for the spaces
    ``json.dumps`` puts after ``,`` and ``:``: a float key of a map as
    ``1.0E20`` and ``1.0E-4`` (not Python's ``1e+20``, ``0.0001``), and a value holding no
    float (written by ``json.dumps`` alone) with its non-ASCII text as it is."""
    from fanout_postgres.encode import _nested_json, _nested_values

    rows = pa.table(
        {
            "id": pa.array([0, 1], pa.int64()),
            "m": pa.array([[(1e20, "a"), (0.0001, "b")], [(NAN, "c")]],
                          pa.map_(pa.float64(), pa.string())),
            "mf": pa.array([[(0.1, 1)], []], pa.map_(pa.float32(), pa.int32())),
            "s": pa.array([{"n": 1, "t": "é", "l": [1, None]}, {"n": None, "t": "\u2603",
                           "l": []}], pa.struct([("n", pa.int64()), ("t", pa.string()),
                                                 ("l", pa.list_(pa.int64()))])),
        }
    )  # fmt: skip
    frame = spark.createDataFrame(rows).orderBy("id")
    for column in ("m", "mf", "s"):
        spark_text = f"to_json({column}, map('ignoreNullFields', 'false')) AS j"
        theirs = frame.selectExpr(spark_text).toArrow().column("j").to_pylist()
        dump = _nested_json(rows.schema.field(column).type)
        ours = [dump(v) for v in _nested_values(rows.column(column).combine_chunks())]
        assert [t.replace(", ", ",").replace(": ", ":") for t in ours] == theirs, column


def test_nested_bool_keys_and_text_beside_decimals_are_spark_s_to_json(spark: Any) -> None:
    """A map's boolean key is named ``true`` / ``false`` (as Spark's ``to_json`` and
    PostgreSQL name it; it was Python's ``True``), and a value holding a decimal keeps its
    non-ASCII text as it is, as every other nested value does (it was ``\\u00e9``): the
    same string is the same text in a ``json`` column whatever the type beside it."""
    from decimal import Decimal

    from fanout_postgres.encode import _nested_json, _nested_values

    rows = pa.table(
        {
            "id": pa.array([0, 1], pa.int64()),
            "mb": pa.array([[(True, 1), (False, None)], []], pa.map_(pa.bool_(), pa.int32())),
            "sd": pa.array([{"d": Decimal("1.50"), "t": "é\u2603"}, {"d": None, "t": None}],
                           pa.struct([("d", pa.decimal128(5, 2)), ("t", pa.string())])),
            "md": pa.array([[("ü", Decimal("0.10"))], [("k", None)]],
                           pa.map_(pa.string(), pa.decimal128(5, 2))),
        }
    )  # fmt: skip
    frame = spark.createDataFrame(rows).orderBy("id")
    expected = {
        "mb": ['{"true":1,"false":null}', "{}"],
        "sd": ['{"d":1.50,"t":"é☃"}', '{"d":null,"t":null}'],
        "md": ['{"ü":0.10}', '{"k":null}'],
    }
    for column, texts in expected.items():
        spark_text = f"to_json({column}, map('ignoreNullFields', 'false')) AS j"
        assert frame.selectExpr(spark_text).toArrow().column("j").to_pylist() == texts
        dump = _nested_json(rows.schema.field(column).type)
        ours = [dump(v) for v in _nested_values(rows.column(column).combine_chunks())]
        assert [t.replace(", ", ",").replace(": ", ":") for t in ours] == texts, column
