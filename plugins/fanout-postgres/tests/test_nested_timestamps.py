"""Timestamps and dates inside arrays, maps and structs, and in dead letters, are ISO 8601
whatever Spark's session time zone: an instant in UTC with its offset (as a top-level
instant is stored), a ``timestamp_ntz`` as its own wall clock without offset, a date as
``YYYY-MM-DD``.

Written by Spark under an ``Asia/Kolkata`` session (Arrow then carries every instant in that
zone, nested ones included), on each path a nested value takes: ``COPY`` straight into the
target (append), ``COPY`` into the staging table (an upsert whose key is already there), and
a dead letter's row. A nested column has no binary ``COPY`` form: its partitions always
take the CSV path.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from fanout_postgres import PostgresSink
from pgcheck import execute, query

from fanout.contract.batch import Batch, BatchInfo
from fanout.testing import open_sink

SCHEMA = (
    "id LONG, at TIMESTAMP, s STRUCT<at: TIMESTAMP, ntz: TIMESTAMP_NTZ, day: DATE>, "
    "a ARRAY<TIMESTAMP>, m MAP<TIMESTAMP, DATE>"
)
AT = dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC)  # 08:34:05.123456 in Kolkata
WHOLE = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)  # no fraction: none written
NTZ = dt.datetime(2024, 1, 2, 3, 4, 5)
DAY = dt.date(2024, 1, 2)
ROWS = [
    (1, AT, (AT, NTZ, DAY), [AT, WHOLE, None], {WHOLE: DAY}),
    (-1, AT, (WHOLE, NTZ, DAY), [WHOLE], {}),  # refused by the CHECK: a dead letter
]
STORED = (
    1,
    '{"at": "2024-01-02T03:04:05.123456+00:00", "ntz": "2024-01-02T03:04:05", "day": "2024-01-02"}',
    '["2024-01-02T03:04:05.123456+00:00", "2024-01-02T03:04:05+00:00", null]',
    '{"2024-01-02T03:04:05+00:00": "2024-01-02"}',
)
LETTER = (  # the row is jsonb: an object's keys in jsonb's order
    -1,
    "2024-01-02T03:04:05.123456+00:00",
    '{"at": "2024-01-02T03:04:05+00:00", "day": "2024-01-02", "ntz": "2024-01-02T03:04:05"}',
    '["2024-01-02T03:04:05+00:00"]',
    "{}",
)


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_nested_timestamps_are_iso_8601_in_utc_whatever_the_session_zone(
    spark: Any, pg_url: str, mode: str
) -> None:
    execute(
        pg_url,
        "CREATE TABLE events (id bigint PRIMARY KEY CHECK (id > 0), at timestamptz, s json, "
        "a json, m jsonb)",
    )
    if mode == "upsert":  # key 1 is there: the direct COPY is refused, the rows are staged
        execute(pg_url, "INSERT INTO events (id) VALUES (1)")
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "Asia/Kolkata")
    try:
        df = spark.createDataFrame(ROWS, SCHEMA).coalesce(1)
        sink = PostgresSink(
            "pg", url=pg_url, table="events", mode=mode, dead_letter="postgres:rejects"
        )
        open_sink(sink, "nested", spark=spark)
        sink.write(Batch(df, BatchInfo("nested", 0, "q"), "pg", "fanout/nested/pg"))
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)

    assert query(pg_url, "SELECT id, s::text, a::text, m::text FROM events") == [STORED]
    assert query(pg_url, "SELECT at FROM events") == [(AT,)]  # the top-level instant
    letters = query(
        pg_url,
        "SELECT (row->>'id')::int, row->>'at', (row->'s')::text, (row->'a')::text, "
        "(row->'m')::text FROM rejects",
    )
    assert letters == [LETTER]
