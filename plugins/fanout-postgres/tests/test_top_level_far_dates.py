"""Top-level dates and timestamps outside the years 1-9999 into PostgreSQL's ``date``,
``timestamp`` and ``timestamptz``. Spark holds years from about 290308 BC to 294247 AD
(dates: 5877641 BC to 5881580 AD); PostgreSQL holds 4714-11-24 BC to 294276 AD
(``date``: to 5874897 AD). What it can hold is written exactly (read back as PostgreSQL's
own text); what it cannot is refused naming the sink, the batch, the column and the value,
or dead-lettered. Both encodings: binary COPY (every column allows it) and CSV COPY (a
``numeric`` column makes the partition travel as text), whose year 0 and earlier
PostgreSQL reads only as ``... BC`` (``0001-12-31 BC`` is Spark's ``0000-12-31``)."""

from __future__ import annotations

from typing import Any

import pytest
from fanout_postgres import PostgresSink
from pgcheck import execute, query

from fanout.contract.batch import Batch, BatchInfo
from fanout.errors import SinkWriteError
from fanout.testing import open_sink

PG_FIRST_MICROS = -210_866_803_200_000_000  # 4714-11-24 00:00:00 BC, PostgreSQL's first
PG_FIRST_DAY = -2_440_588  # 4714-11-24 BC
PG_LAST_DAY = 2_145_042_905  # 5874897-12-31, PostgreSQL's last date
HELD = [
    # id, microseconds since 1970 (timestamp_ntz, timestamp), days since 1970 (date)
    (1, 0, 0),
    (2, 253_402_300_800_000_123, 2_932_897),  # 10000-01-01
    (3, -62_135_683_199_500_000, -719_163),  # 0000-12-31 (1 BC), half a second in
    (4, -62_167_219_200_000_001, -719_529),  # -0001-12-31 23:59:59.999999 (2 BC)
    (5, PG_FIRST_MICROS, PG_FIRST_DAY),
    (6, 9_223_372_036_854_775_807, PG_LAST_DAY),  # Spark's last timestamp: 294247 AD
]
STORED = [
    (1, "1970-01-01 00:00:00", "1970-01-01 00:00:00+00", "1970-01-01"),
    (2, "10000-01-01 00:00:00.000123", "10000-01-01 00:00:00.000123+00", "10000-01-01"),
    (3, "0001-12-31 00:00:00.5 BC", "0001-12-31 00:00:00.5+00 BC", "0001-12-31 BC"),
    (4, "0002-12-31 23:59:59.999999 BC", "0002-12-31 23:59:59.999999+00 BC", "0002-12-31 BC"),
    (5, "4714-11-24 00:00:00 BC", "4714-11-24 00:00:00+00 BC", "4714-11-24 BC"),
    (6, "294247-01-10 04:00:54.775807", "294247-01-10 04:00:54.775807+00", "5874897-12-31"),
]
SELECT_STORED = (
    "SELECT id, ts::text, tz::text, d::text FROM far ORDER BY id"  # the session is in UTC
)


def batch_sql(rows: list[tuple[int, int, int]], with_numeric: bool) -> str:
    values = ", ".join(f"({i}L, {m}L, {d})" for i, m, d in rows)
    numeric = ", CAST(id AS DECIMAL(10, 2)) AS n" if with_numeric else ""
    return (
        "SELECT id, CAST(timestamp_micros(m) AS TIMESTAMP_NTZ) AS ts, timestamp_micros(m) AS tz,"
        f" date_from_unix_date(d) AS d{numeric} FROM VALUES {values} AS t(id, m, d)"
    )


def create_far(pg_url: str, with_numeric: bool) -> None:
    numeric = ", n numeric(10, 2)" if with_numeric else ""
    execute(
        pg_url,
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET TimeZone = ''UTC''', "
        "current_database()); END $$",
        f"CREATE TABLE far (id bigint PRIMARY KEY, ts timestamp, tz timestamptz, d date{numeric})",
    )


def write(spark: Any, pg_url: str, sql: str, mode: str, **options: Any) -> Any:
    sink = PostgresSink("pg", url=pg_url, table="far", mode=mode, partitions=1, **options)
    open_sink(sink, "far")
    return sink.write(Batch(spark.sql(sql), BatchInfo("far", 7, "q"), "pg", "fanout/far/pg"))


@pytest.mark.parametrize("wire", ["binary", "csv"])
@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_dates_postgresql_holds_are_written_exactly(spark, pg_url, mode, wire):
    create_far(pg_url, with_numeric=wire == "csv")

    result = write(spark, pg_url, batch_sql(HELD, wire == "csv"), mode)

    assert (result.rows, result.dead_lettered) == (len(HELD), 0)
    assert query(pg_url, SELECT_STORED) == STORED


REFUSED = [
    # id, column, microseconds, days, the value as the dead letter shows it
    (7, "ts", PG_FIRST_MICROS - 1, 0, "-4713-11-23T23:59:59.999999"),
    (8, "tz", PG_FIRST_MICROS - 1, 0, "-4713-11-23T23:59:59.999999+00:00"),
    (9, "d", 0, PG_FIRST_DAY - 1, "-4713-11-23"),
    (10, "d", 0, PG_LAST_DAY + 1, "+5874898-01-01"),
]


@pytest.mark.parametrize("wire", ["binary", "csv"])
@pytest.mark.parametrize("mode", ["append", "upsert"])
@pytest.mark.parametrize("refused", REFUSED, ids=lambda r: f"{r[1]}-{r[0]}")
def test_a_date_postgresql_cannot_hold_fails_the_batch_naming_it(
    spark, pg_url, mode, wire, refused
):
    create_far(pg_url, with_numeric=wire == "csv")
    row, column, micros, days, shown = refused
    # the other two columns of the refused row hold 1970: only ``column`` is out of range
    values = (row, micros if column in ("ts", "tz") else 0, days)
    sql = batch_sql([*HELD[:2], values], wire == "csv")
    if column == "ts":
        sql = sql.replace("timestamp_micros(m) AS tz", "timestamp_micros(IF(id = 7, 0, m)) AS tz")
    if column == "tz":
        sql = sql.replace(
            "CAST(timestamp_micros(m) AS TIMESTAMP_NTZ)",
            "CAST(timestamp_micros(IF(id = 8, 0, m)) AS TIMESTAMP_NTZ)",
        )

    with pytest.raises(SinkWriteError) as caught:
        write(spark, pg_url, sql, mode)

    message = str(caught.value)
    assert "sink 'pg', batch 7" in message, message
    assert f"column {column!r}" in message or f'column "{column}"' in message, message
    assert shown in message, message
    assert query(pg_url, "SELECT count(*) FROM far") == [(0,)]


@pytest.mark.parametrize("wire", ["binary", "csv"])
@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_dates_postgresql_cannot_hold_are_dead_lettered(spark, pg_url, mode, wire):
    create_far(pg_url, with_numeric=wire == "csv")
    refused = [(7, PG_FIRST_MICROS - 1, 0), (9, 0, PG_FIRST_DAY - 1), (10, 0, PG_LAST_DAY + 1)]

    result = write(spark, pg_url, batch_sql([*HELD, *refused], wire == "csv"), mode,
                   dead_letter="postgres:rejects")  # fmt: skip

    assert (result.rows, result.dead_lettered) == (len(HELD), 3)
    assert query(pg_url, SELECT_STORED) == STORED
    letters = query(pg_url, "SELECT row->>'id', column_name, value FROM rejects ORDER BY 1")
    assert letters == [
        ("10", "d", "+5874898-01-01"),
        ("7", "ts", "-4713-11-23T23:59:59.999999"),
        ("9", "d", "-4713-11-23"),
    ]


def test_csv_writes_years_outside_1_to_9999_as_postgresql_reads_them():
    import pyarrow as pa
    from fanout_postgres.encode import to_csv

    micros = [0, 253_402_300_800_000_123, -62_135_683_199_500_000, 9_223_372_036_854_775_807,
              None]  # fmt: skip
    days = [5, 2_932_897, -719_163, PG_LAST_DAY + 1, None]
    table = pa.table({
        "ts": pa.array(micros, pa.timestamp("us")),
        "tz": pa.array(micros, pa.timestamp("us", "America/New_York")),
        "d": pa.array(days, pa.date32()),
    })  # fmt: skip

    assert to_csv(table).decode().splitlines() == [
        '"1970-01-01 00:00:00.000000","1970-01-01 00:00:00.000000Z","1970-01-06"',
        '"10000-01-01 00:00:00.000123","10000-01-01 00:00:00.000123Z","10000-01-01"',
        '"0001-12-31 00:00:00.500000 BC","0001-12-31 00:00:00.500000Z BC","0001-12-31 BC"',
        '"294247-01-10 04:00:54.775807","294247-01-10 04:00:54.775807Z","5874898-01-01"',
        ",,",
    ]
    # without such a year, Arrow's own columns, unquoted
    assert to_csv(table.slice(0, 1)).decode() == (
        "1970-01-01 00:00:00.000000,1970-01-01 00:00:00.000000Z,1970-01-06\n"
    )
