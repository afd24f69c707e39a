"""A dead-lettered row holding a date or timestamp outside Python's years 1-9999 inside a
struct, an array or a map: the letter holds it as the text Spark's ``to_json`` writes
(``+10000-01-01T00:00:00.000123+00:00``, ``0000-12-31``), and ``from_json`` with the
batch's schema reads the row back as the batch had it. Python's ``datetime`` cannot hold
such a value: Arrow's ``to_pylist`` raised ``OverflowError`` and the batch failed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fanout import BatchInfo, FanOut
from tests.integration.streams import delta_rows

YEAR_10000 = 253_402_300_800_000_123  # 10000-01-01T00:00:00.000123Z, epoch microseconds
BATCH = f"""
select id, amount,
    named_struct('at', timestamp_micros(m), 'day', date_add(date'0001-01-01', d)) as s,
    array(timestamp_micros(m), timestamp_micros(0)) as a,
    map('k', date_add(date'9999-12-31', -d)) as mp
from values (1L, '5', 0L, 0), (2L, 'abc', {YEAR_10000}L, -1), (3L, 'x', -1L, -400)
    as t(id, amount, m, d)
"""
WHERE = "CAST(amount AS INT) >= 0"
SCHEMA = (
    "id LONG, amount STRING, s STRUCT<at: TIMESTAMP, day: DATE>, a ARRAY<TIMESTAMP>, "
    "mp MAP<STRING, DATE>"
)
LETTERS = [
    {
        "id": 2,
        "amount": "abc",
        "s": {"at": "+10000-01-01T00:00:00.000123+00:00", "day": "0000-12-31"},
        "a": ["+10000-01-01T00:00:00.000123+00:00", "1970-01-01T00:00:00+00:00"],
        "mp": {"k": "+10000-01-01"},
    },
    {
        "id": 3,
        "amount": "x",
        "s": {"at": "1969-12-31T23:59:59.999999+00:00", "day": "-0001-11-28"},
        "a": ["1969-12-31T23:59:59.999999+00:00", "1970-01-01T00:00:00+00:00"],
        "mp": {"k": "+10001-02-03"},
    },
]


def test_a_route_dead_letter_holds_nested_dates_outside_python_s_years(
    spark: Any, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    sink = {"type": "delta", "name": "routed", "path": str(tmp_path / "routed"),
            "where": WHERE, "dead_letter": str(tmp_path / "dead")}  # fmt: skip
    fan = FanOut("far", str(tmp_path / "ledger"), [sink], retries=0)
    result = fan.process(spark.sql(BATCH), BatchInfo("far", 0, "q"))["routed"]

    assert (result.rows, result.dead_lettered) == (1, 2)
    assert [r["id"] for r in delta_rows(tmp_path / "routed")] == [1]
    dead = sorted(delta_rows(tmp_path / "dead"), key=lambda d: json.loads(d["row"])["id"])
    assert [(d["source"], json.loads(d["row"])) for d in dead] == [
        ("route", letter) for letter in LETTERS
    ]
    # Spark reads each letter back as the batch had the row
    back = spark.createDataFrame([(d["row"],) for d in dead], "row string").select(
        F.from_json("row", SCHEMA).alias("r")
    )
    read = back.select(F.to_json("r")).toArrow().column(0).to_pylist()
    batch = spark.sql(BATCH).filter("id > 1").orderBy("id")
    assert read == batch.select(F.to_json(F.struct("*"))).toArrow().column(0).to_pylist()
    assert back.select("r.s.day").toArrow().column(0).cast("int32").to_pylist() == [
        -719_163,  # 0000-12-31 (0001-01-01 is day -719162)
        -719_562,  # 400 days before 0001-01-01
    ]
