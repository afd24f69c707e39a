"""A string upsert key written to a date or time column is read by PostgreSQL in the
connection's ``TimeZone`` (``timestamptz``, ``timetz``: a time without an offset) and
``DateStyle`` (``date``, ``timestamp``, ``timestamptz``: ``01/02/2024`` is January 2 under
MDY, February 1 under DMY), settings of the server, database or role that fanout does not
record. Up to this version such a key was taken with ``partitions: 1`` (with more, the key
was refused already: no fold reads text as PostgreSQL does), and a change of the setting
moved every key: two writes of ``'2024-01-01 10:00:00'`` under UTC and New York left two
rows five hours apart, of ``'01/02/2024'`` under MDY and DMY two dates. It is refused
before any write unless option ``settings`` pins what it is read by; a cast in the query
makes it a value Spark reads in its session, whose time zone fanout records."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from fanout_postgres import PostgresSink
from pgcheck import execute, query

from fanout.contract.batch import Batch, BatchInfo
from fanout.contract.sink import SinkContext
from fanout.errors import SchemaMismatchError

MOVES = (
    "settings of the connection that fanout does not record, so a change (of the server's, "
    "the database's or the role's) moves every key and the next write, or a replay, puts "
    "keys beside the old ones"
)
TIME_ZONE = "a time without an offset in its TimeZone"
DATE_STYLE = (
    "a date such as 01/02/2024 in its DateStyle's order of fields (January 2 under MDY, "
    "February 1 under DMY)"
)


def _upsert(spark: Any, url: str, table: str, key: str, v: int, batch_id: int,
            settings: dict[str, str] | None = None) -> None:  # fmt: skip
    sink = PostgresSink("pg", url=url, table=table, partitions=1, settings=settings)
    sink.open(SinkContext("tk"))
    try:
        df = spark.createDataFrame([(key, v)], "k string, v bigint")
        if key.startswith("cast:"):
            df = spark.createDataFrame([(key[5:], v)], "k string, v bigint").selectExpr(
                "CAST(k AS timestamp) AS k", "v"
            )
        sink.write(Batch(df, BatchInfo("tk", batch_id, "q"), "pg", "fanout/tk/pg"))
    finally:
        sink.close()


def _database_default(url: str, name: str, value: str) -> None:
    (database,) = query(url, "SELECT current_database()")[0]
    execute(url, f'ALTER DATABASE "{database}" SET "{name}" = \'{value}\'')


def test_a_string_key_into_timestamptz_is_refused_unless_its_settings_are_pinned(
    spark: Any, pg_url: str
) -> None:
    execute(pg_url, "CREATE TABLE t (k timestamptz PRIMARY KEY, v bigint)")
    with pytest.raises(SchemaMismatchError) as caught:
        _upsert(spark, pg_url, "t", "2024-01-01 10:00:00", 1, 0)
    assert str(caught.value) == (
        "sink 'pg', batch 0: key column 'k' (string) is written to column k of table t "
        f"(TIMESTAMP WITH TIME ZONE): PostgreSQL reads {TIME_ZONE} and {DATE_STYLE}, {MOVES}; "
        "cast it in the query, to a value Spark reads in its session (whose time zone fanout "
        'records): F.col("k").cast("timestamp") (in a sink\'s select: CAST(k AS timestamp) '
        "AS k), or pin TimeZone and DateStyle in option 'settings' (e.g. settings: "
        "{TimeZone: 'UTC', DateStyle: 'ISO, MDY'})"
    )
    assert caught.value.columns == ["k"]
    with pytest.raises(SchemaMismatchError) as caught:  # one pinned, the other not
        _upsert(spark, pg_url, "t", "2024-01-01 10:00:00", 1, 0, {"timezone": "UTC"})
    assert f"PostgreSQL reads {DATE_STYLE}, {MOVES}; " in str(caught.value)
    assert str(caught.value).endswith("or pin DateStyle in option 'settings' (e.g. settings: "
                                      "{DateStyle: 'ISO, MDY'})")  # fmt: skip
    assert query(pg_url, "SELECT count(*) FROM t") == [(0,)]

    # pinned: the database's default changing between two writes moves no key
    pinned = {"TimeZone": "UTC", "DateStyle": "ISO, MDY"}
    _database_default(pg_url, "TimeZone", "UTC")
    _upsert(spark, pg_url, "t", "2024-01-01 10:00:00", 1, 0, pinned)
    _database_default(pg_url, "TimeZone", "America/New_York")
    _upsert(spark, pg_url, "t", "2024-01-01 10:00:00", 2, 1, pinned)
    utc = dt.UTC
    assert query(pg_url, "SELECT k AT TIME ZONE 'UTC', v FROM t") == [
        (dt.datetime(2024, 1, 1, 10, 0), 2)
    ]
    # cast in the query: an instant, read in the Spark session's time zone
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        _upsert(spark, pg_url, "t", "cast:2024-01-01 10:00:00", 3, 2)
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    assert query(pg_url, "SELECT k, v FROM t") == [(dt.datetime(2024, 1, 1, 10, tzinfo=utc), 3)]


def test_a_string_key_into_date_is_refused_unless_date_style_is_pinned(
    spark: Any, pg_url: str
) -> None:
    execute(pg_url, "CREATE TABLE d (k date PRIMARY KEY, v bigint)")
    with pytest.raises(SchemaMismatchError) as caught:
        _upsert(spark, pg_url, "d", "01/02/2024", 1, 0, {"TimeZone": "UTC"})
    assert str(caught.value) == (
        "sink 'pg', batch 0: key column 'k' (string) is written to column k of table d "
        f"(DATE): PostgreSQL reads {DATE_STYLE}, {MOVES}; cast it in the query, to a value "
        "Spark reads in its session (whose time zone fanout records): "
        'F.col("k").cast("date") (in a sink\'s select: CAST(k AS date) AS k), or pin '
        "DateStyle in option 'settings' (e.g. settings: {DateStyle: 'ISO, MDY'})"
    )
    assert query(pg_url, "SELECT count(*) FROM d") == [(0,)]

    _database_default(pg_url, "DateStyle", "ISO, MDY")
    _upsert(spark, pg_url, "d", "01/02/2024", 1, 0, {"datestyle": "ISO, MDY"})
    _database_default(pg_url, "DateStyle", "ISO, DMY")
    _upsert(spark, pg_url, "d", "01/02/2024", 2, 1, {"datestyle": "ISO, MDY"})
    assert query(pg_url, "SELECT k, v FROM d") == [(dt.date(2024, 1, 2), 2)]
