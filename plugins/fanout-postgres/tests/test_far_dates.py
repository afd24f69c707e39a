"""Dates and timestamps outside Python's years 1-9999 inside arrays, maps and structs: a
nested column holds them, and a dead letter's row, as the text Spark's ``to_json`` writes
(``+10000-01-01T00:00:00.000123+00:00``, ``0000-12-31``). Python's ``datetime`` cannot hold
them: Arrow's ``to_pylist`` raised ``OverflowError`` and the partition failed. A refused
row's ``value`` is its column's JSON as the table would have stored it."""

from __future__ import annotations

from typing import Any

import pytest
from fanout_postgres import PostgresSink
from pgcheck import execute, query

from fanout.contract.batch import Batch, BatchInfo
from fanout.testing import open_sink

YEAR_10000 = 253_402_300_800_000_123  # 10000-01-01T00:00:00.000123Z, epoch microseconds
BATCH = f"""
select id, named_struct('at', timestamp_micros(m), 'day', date_add(date'0001-01-01', d)) as s,
    array(timestamp_micros(m)) as a, map('k', date_add(date'9999-12-31', -d)) as mp
from values (1L, 0L, 0), (2L, {YEAR_10000}L, -1), (3L, {YEAR_10000}L, -400) as t(id, m, d)
"""
STORED = [
    (1, {"at": "1970-01-01T00:00:00+00:00", "day": "0001-01-01"},
     ["1970-01-01T00:00:00+00:00"], {"k": "9999-12-31"}),
    (2, {"at": "+10000-01-01T00:00:00.000123+00:00", "day": "0000-12-31"},
     ["+10000-01-01T00:00:00.000123+00:00"], {"k": "+10000-01-01"}),
]  # fmt: skip
LETTER = {
    "id": 3,
    "s": {"at": "+10000-01-01T00:00:00.000123+00:00", "day": "-0001-11-28"},
    "a": ["+10000-01-01T00:00:00.000123+00:00"],
    "mp": {"k": "+10001-02-03"},
}


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_nested_dates_outside_python_s_years_are_stored_and_dead_lettered(
    spark: Any, pg_url: str, mode: str
) -> None:
    execute(
        pg_url,
        "CREATE TABLE far (id bigint PRIMARY KEY, s jsonb CHECK (s->>'day' NOT LIKE '-%'), "
        "a jsonb, mp jsonb)",
    )
    sink = PostgresSink("pg", url=pg_url, table="far", mode=mode, partitions=1,
                        dead_letter="postgres:rejects")  # fmt: skip
    open_sink(sink, "far")
    batch = Batch(spark.sql(BATCH), BatchInfo("far", 0, "q"), "pg", "fanout/far/pg")

    result = sink.write(batch)

    assert (result.rows, result.dead_lettered) == (2, 1)
    assert query(pg_url, "SELECT id, s, a, mp FROM far ORDER BY id") == STORED
    assert query(pg_url, "SELECT column_name, value, row FROM rejects") == [
        ("s", '{"at": "+10000-01-01T00:00:00.000123+00:00", "day": "-0001-11-28"}', LETTER)
    ]
