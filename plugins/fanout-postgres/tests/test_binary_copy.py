"""Binary COPY: every column type sent in binary lands exactly as the CSV path lands it.

The same rows are written twice, once to a table whose columns all take PostgreSQL's
binary format and once through the CSV path (forced by one extra ``numeric`` column that
has no binary encoder); the two tables must hold the same values, and both the values
these rows mean.
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from fanout_postgres import PostgresSink
from fanout_postgres.binary import encoder_for
from pgcheck import execute, query

from fanout.contract.batch import Batch, BatchInfo
from fanout.contract.sink import SinkContext

COLUMNS = (
    "id bigint PRIMARY KEY, tiny smallint, small smallint, num integer, big bigint, "
    "f4 real, f8 double precision, flag boolean, name text, code varchar(8), letter char(3), "
    "day date, at_utc timestamptz, at_wall timestamp, raw bytea, doc json, docb jsonb"
)
SPARK_SCHEMA = (
    "id LONG, tiny BYTE, small SHORT, num INT, big LONG, f4 FLOAT, f8 DOUBLE, flag BOOLEAN, "
    "name STRING, code STRING, letter STRING, day DATE, at_utc TIMESTAMP, "
    "at_wall TIMESTAMP_NTZ, raw BINARY, doc STRING, docb STRING"
)
NAMES = [c.split()[0] for c in SPARK_SCHEMA.split(", ")]


def _rows() -> list[tuple[Any, ...]]:
    utc = dt.UTC
    # fmt: off
    return [
        (
            1, -128, -32768, -2147483648, -(2**63), -1.5, -0.1, True, "", "a", "ab",
            dt.date(1969, 12, 31), dt.datetime(1969, 7, 20, 20, 17, 40, 123456, tzinfo=utc),
            dt.datetime(1999, 12, 31, 23, 59, 59, 999999), b"", "{}", "{}",
        ),
        (
            2, 127, 32767, 2147483647, 2**63 - 1, 3.25, 1e300, False, "naïve ☃ — 𝄞",
            "12345678", "xyz", dt.date(2000, 1, 1), dt.datetime(2000, 1, 1, tzinfo=utc),
            dt.datetime(2000, 1, 1), b"\x00\xff\x10", '{"a": [1, 2.5, null]}',
            '{"b": {"c": "d"}, "a": 1}',
        ),
        (
            3, 0, 0, 0, 0, float("nan"), float("inf"), None, "tab\there\nline \"q\" \\ ,", " ",
            "z", dt.date(2262, 4, 11), dt.datetime(2026, 11, 21, 8, 30, 1, 5, tzinfo=utc),
            dt.datetime(1900, 2, 28, 1, 2, 3), b"\\x41", "[]", "[1, \"x\"]",
        ),
        (4,) + (None,) * (len(NAMES) - 1),
    ]
    # fmt: on


def _write(spark: Any, url: str, table: str, df: Any) -> None:
    sink = PostgresSink("pg", url=url, table=table, partitions=2)
    sink.open(SinkContext("binary", spark))
    sink.write(Batch(df, BatchInfo("binary", 0, "q"), "pg", "fanout/binary/pg"))


def test_every_binary_type_lands_as_the_csv_path_lands_it(spark: Any, pg_url: str) -> None:
    execute(pg_url, f"CREATE TABLE by_binary ({COLUMNS})")
    execute(pg_url, f"CREATE TABLE by_csv ({COLUMNS}, extra numeric)")
    df = spark.createDataFrame(_rows(), SPARK_SCHEMA)
    arrow = df.toArrow()
    # fmt: off
    plan_kinds = [
        "int8", "int2", "int2", "int4", "int8", "float4", "float8", "bool", "text", "text",
        "text", "date", "timestamptz", "timestamp", "bytea", "json", "jsonb",
    ]
    # fmt: on
    assert encoder_for(arrow.schema, plan_kinds) is not None  # the binary path is taken
    _write(spark, pg_url, "by_binary", df)
    _write(spark, pg_url, "by_csv", df.selectExpr("*", "CAST(id AS DECIMAL(10, 2)) AS extra"))

    select = ", ".join(NAMES[:-2]) + ", doc::text, docb::text"
    by_binary = query(pg_url, f"SELECT {select} FROM by_binary ORDER BY id")
    by_csv = query(pg_url, f"SELECT {select} FROM by_csv ORDER BY id")
    assert [_comparable(r) for r in by_binary] == [_comparable(r) for r in by_csv]
    assert query(pg_url, "SELECT extra FROM by_csv ORDER BY id") == [
        (Decimal(i),) for i in (1, 2, 3, 4)
    ]

    expected = _rows()
    assert len(by_binary) == 4
    for got, want in zip(by_binary, expected, strict=True):
        for name, g, w in zip(NAMES, got, want, strict=True):
            if name in ("doc", "docb") and w is not None:
                assert _json(g) == _json(w), name
            elif name == "letter" and w is not None:
                assert g == w.ljust(3), name  # char(n) pads
            elif name == "raw" and w is not None:
                assert bytes(g) == w, name
            elif name == "f4" and w is not None and not math.isnan(w):
                assert g == pytest.approx(w), name
            elif isinstance(w, float) and math.isnan(w):
                assert math.isnan(g), name
            elif name == "at_wall" and w is not None:
                assert g == w, name
            else:
                assert g == w, name


def test_columns_without_an_exact_binary_form_take_the_csv_path() -> None:
    wide_int = pa.schema([("n", pa.int64())])
    assert encoder_for(wide_int, ["int4"]) is None  # an overflow must be the server's error
    assert encoder_for(pa.schema([("x", pa.float32())]), ["float8"]) is None
    assert encoder_for(pa.schema([("t", pa.timestamp("us"))]), ["timestamptz"]) is None
    assert encoder_for(pa.schema([("t", pa.timestamp("ns", tz="UTC"))]), ["timestamptz"]) is None
    assert encoder_for(pa.schema([("s", pa.string())]), [None]) is None
    assert encoder_for(pa.schema([("i", pa.int32())]), ["text"]) is None
    assert encoder_for(pa.schema([("i", pa.int32())]), ["int8"]) is not None


def _comparable(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(
        "nan"
        if isinstance(v, float) and math.isnan(v)
        else bytes(v)
        if isinstance(v, memoryview)
        else v
        for v in row
    )


def _json(text: Any) -> Any:
    import json

    return json.loads(text) if isinstance(text, str) else text
