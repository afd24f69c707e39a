"""A batch column PostgreSQL would round silently (a double into numeric(10,2), a timestamp
into timestamp(3)) is refused when the plan is built, before any row is written, with the
cast that makes the rounding the query's own; with that cast the batch writes exactly."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fanout_postgres import PostgresSink
from fanout_postgres.identifiers import TableName
from fanout_postgres.plan import reflect
from fanout_postgres.types import loss
from pgcheck import execute, query
from pyspark.sql import functions as F
from pyspark.sql import types as T

from fanout import BatchFailedError, BatchInfo, FanOut
from fanout.contract.batch import Batch
from fanout.contract.sink import SinkContext
from fanout.errors import ConfigurationError, SchemaMismatchError
from tests.integration.streams import delta_rows

DDL = "CREATE TABLE prices (id bigint PRIMARY KEY, price numeric(10,2))"
SCHEMA = "id LONG, price DOUBLE"
ROWS = [(1, 1.2345), (2, 2.5), (3, 9.999), (4, None)]
STORED = [(1, Decimal("1.23")), (2, Decimal("2.50")), (3, Decimal("10.00")), (4, None)]
REFUSED = (
    "batch column 'price' (double) cannot be written to column price of table prices "
    "(NUMERIC(10, 2)) without loss: PostgreSQL would round its values to 2 decimal places; "
    'cast it in the query so the rounding is yours: F.col("price").cast("decimal(10,2)") '
    "(in a sink's select: CAST(price AS decimal(10,2)) AS price), or change the column's type"
)


def _fan(url: str, ledger: str, **route: Any) -> FanOut:
    sink = {"type": "postgres", "name": "pg", "url": url, "table": "prices", "partitions": 2,
            **route}  # fmt: skip
    return FanOut("rounding", ledger, [sink], retries=0)


def _prices(url: str) -> list[tuple[Any, ...]]:
    return query(url, "SELECT id, price FROM prices ORDER BY id")


def test_a_double_into_numeric_10_2_is_refused_before_any_row_is_written(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    execute(pg_url, DDL)
    ledger = str(tmp_path / "ledger")
    with pytest.raises(BatchFailedError) as caught:
        _fan(pg_url, ledger).process(spark.createDataFrame(ROWS, SCHEMA), BatchInfo("r", 3, "q"))
    error = caught.value.failures["pg"]
    assert isinstance(error, SchemaMismatchError)
    assert str(error) == f"sink 'pg', batch 3: {REFUSED}"
    assert error.columns == ["price"]
    assert _prices(pg_url) == []
    assert [r for r in delta_rows(tmp_path / "ledger") if r["status"] == "committed"] == []


@pytest.mark.parametrize("where", ["pyspark", "select"])
def test_with_the_cast_in_the_query_the_batch_writes_the_exact_values(
    spark: Any, pg_url: str, tmp_path: Path, where: str
) -> None:
    execute(pg_url, DDL)
    df = spark.createDataFrame(ROWS, SCHEMA)
    ledger = str(tmp_path / "ledger")
    with pytest.raises(BatchFailedError):  # as it was: refused, nothing written
        _fan(pg_url, ledger).process(df, BatchInfo("r", 0, "q"))
    assert _prices(pg_url) == []

    if where == "pyspark":  # the remedy the message names, as PySpark and as a route
        cast = df.select("id", F.col("price").cast("decimal(10,2)").alias("price"))
        result = _fan(pg_url, ledger).process(cast, BatchInfo("r", 0, "q"))
    else:
        select = ["id", "CAST(price AS decimal(10,2)) AS price"]
        result = _fan(pg_url, ledger, select=select).process(df, BatchInfo("r", 0, "q"))
    assert result["pg"].rows == 4
    assert _prices(pg_url) == STORED


TO_UTC_TEXT = (
    'F.date_format(F.to_utc_timestamp(F.col("at"), F.current_timezone()), '
    '"yyyy-MM-dd HH:mm:ss.SSS") (in a sink\'s select: date_format(to_utc_timestamp(at, '
    "current_timezone()), 'yyyy-MM-dd HH:mm:ss.SSS') AS at)"
)
WITH_OFFSET = (
    'F.date_format(F.col("at"), "yyyy-MM-dd HH:mm:ss.SSSXXX") (in a sink\'s select: '
    "date_format(at, 'yyyy-MM-dd HH:mm:ss.SSSXXX') AS at)"
)


@pytest.mark.parametrize("column", ["timestamp(3)", "timestamptz(3)"])
def test_a_timestamp_into_timestamp_3_is_refused_and_written_once_formatted(
    spark: Any, pg_url: str, column: str
) -> None:
    """Refused before anything is written; the expression the error names then stores
    what the sink stores for an instant: its UTC wall clock in a ``timestamp`` column, the
    instant in a ``timestamptz`` one, whatever the Spark session's zone and the server's."""
    execute(pg_url, f"CREATE TABLE events (id bigint PRIMARY KEY, at {column})")
    database = sa.engine.make_url(pg_url).database
    # the server's zone is not the session's: the text's offset keeps a timestamptz's instant
    execute(pg_url, f"ALTER DATABASE \"{database}\" SET timezone TO 'America/New_York'")
    at = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC)
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "Asia/Kolkata")  # neither UTC nor the server's
    try:
        df = spark.createDataFrame([(1, at), (2, None)], "id LONG, at TIMESTAMP")
        sink = PostgresSink("pg", url=pg_url, table="events", partitions=2)
        sink.open(SinkContext("rounding", spark))
        with pytest.raises(SchemaMismatchError) as caught:
            sink.write(Batch(df, BatchInfo("rounding", 1, "q"), "pg", "fanout/rounding/pg"))
        pg_type, remedy = {
            "timestamp(3)": ("TIMESTAMP(3) WITHOUT TIME ZONE", TO_UTC_TEXT),
            "timestamptz(3)": ("TIMESTAMP(3) WITH TIME ZONE", WITH_OFFSET),
        }[column]
        assert str(caught.value) == (
            f"sink 'pg', batch 1: batch column 'at' (timestamp) cannot be written to column at "
            f"of table events ({pg_type}) without loss: PostgreSQL would round its values to 3 "
            f"decimal places of a second; format it as text in the query so the rounding is "
            f"yours: {remedy}, or change the column's type"
        )
        assert query(pg_url, "SELECT count(*) FROM events") == [(0,)]

        expression = remedy.split(" (in a sink's select: ")[1].rsplit(" AS at)", 1)[0]
        text = df.selectExpr("id", f"{expression} AS at")
        sink.write(Batch(text, BatchInfo("rounding", 1, "q"), "pg", "fanout/rounding/pg"))
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    stored = at.replace(microsecond=123000)  # the query's choice: truncated to milliseconds
    if column == "timestamp(3)":
        stored = stored.replace(tzinfo=None)  # the instant's UTC wall clock
    assert query(pg_url, "SELECT id, at FROM events ORDER BY id") == [(1, stored), (2, None)]


def test_refused_at_open_when_the_batch_schema_is_given(spark: Any, pg_url: str) -> None:
    execute(pg_url, DDL)
    sink = PostgresSink("pg", url=pg_url, table="prices", batch_schema=SCHEMA)
    with pytest.raises(ConfigurationError) as caught:
        sink.open(SinkContext("rounding", spark))
    assert str(caught.value) == (
        f"postgres sink 'pg' (table prices): at configuration (option batch_schema): {REFUSED}"
    )
    PostgresSink(
        "pg", url=pg_url, table="prices", batch_schema="id LONG, price DECIMAL(10,2)"
    ).open(SinkContext("rounding", spark))


REFLECTED = {
    # column type: what a double loses there (None: nothing)
    "numeric": None,
    "numeric(10,2)": "to 2 decimal places",
    "numeric(10)": "to whole numbers",
    "real": "to the 6 significant digits a real holds",
    "float4": "to the 6 significant digits a real holds",
    "float(24)": "to the 6 significant digits a real holds",
    "double precision": None,
    "float(25)": None,
}


def test_the_decision_on_the_types_a_real_server_reflects(pg_url: str) -> None:
    columns = [*REFLECTED, "timestamp", "timestamp(6)", "timestamp(3)", "timestamptz(0)"]
    execute(pg_url, "CREATE TABLE kinds (" + ", ".join(
        f"c{i} {t}" for i, t in enumerate(columns)) + ")")  # fmt: skip
    engine = sa.create_engine(pg_url, poolclass=sa.NullPool)
    with engine.connect() as conn:
        info = reflect(conn, TableName("kinds", None))
    engine.dispose()
    assert info is not None
    types = {t: info.columns[f"c{i}"].sa_type for i, t in enumerate(columns)}
    for column, what in REFLECTED.items():
        lost = loss(T.DoubleType(), types[column])
        expected = None if what is None else f"PostgreSQL would round its values {what}"
        assert (None if lost is None else lost.what) == expected, column
    assert loss(T.DecimalType(12, 4), types["numeric(10,2)"]) is not None
    assert loss(T.DecimalType(10, 2), types["numeric(10,2)"]) is None
    assert loss(T.LongType(), types["float(25)"]) is not None
    assert loss(T.IntegerType(), types["float(25)"]) is None
    timestamps = {t: loss(T.TimestampType(), types[t]) for t in columns[-4:]}
    assert [t for t, lost in timestamps.items() if lost] == ["timestamp(3)", "timestamptz(0)"]
