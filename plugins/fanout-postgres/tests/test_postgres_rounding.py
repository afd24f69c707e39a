"""Which Spark type into which PostgreSQL column would make PostgreSQL round values
silently (:func:`fanout_postgres.types.loss`), and the plan's refusal of those pairs;
without a server (the SQLAlchemy types are those reflection gives, checked against a real
server in test_rounding_refused.py)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("fanout_postgres")

import sqlalchemy as sa
from fanout_postgres.identifiers import TableName
from fanout_postgres.plan import PlanError, TargetColumn, TargetInfo, check_batch
from fanout_postgres.types import loss
from pyspark.sql import types as T
from sqlalchemy.dialects import postgresql as pg

# as reflection gives them: numeric(10) has scale 0, float(24) is a real, timestamp's
# precision is None (6)
NUMERIC = sa.NUMERIC()
NUMERIC_10_2 = sa.NUMERIC(10, 2)
NUMERIC_12_2 = sa.NUMERIC(12, 2)
NUMERIC_10_4 = sa.NUMERIC(10, 4)
NUMERIC_10 = sa.NUMERIC(10, 0)
NUMERIC_5_MINUS_2 = sa.NUMERIC(5, -2)
REAL = sa.REAL()
DOUBLE = pg.DOUBLE_PRECISION(precision=53)
TIMESTAMP = pg.TIMESTAMP(timezone=False)
TIMESTAMP_3 = pg.TIMESTAMP(timezone=False, precision=3)
TIMESTAMP_6 = pg.TIMESTAMP(timezone=False, precision=6)
TIMESTAMPTZ = pg.TIMESTAMP(timezone=True)
TIMESTAMPTZ_0 = pg.TIMESTAMP(timezone=True, precision=0)

DOUBLE_T, FLOAT_T = T.DoubleType(), T.FloatType()
BYTE_T, SHORT_T, INT_T, LONG_T = T.ByteType(), T.ShortType(), T.IntegerType(), T.LongType()
TS_T, NTZ_T = T.TimestampType(), T.TimestampNTZType()

ROUNDED = "PostgreSQL would round its values"
LOSSY: list[tuple[Any, Any, str, str]] = [
    # (Spark type, column type, what is lost, the cast or format the remedy names)
    (DOUBLE_T, NUMERIC_10_2, "to 2 decimal places", '.cast("decimal(10,2)")'),
    (FLOAT_T, NUMERIC_10_2, "to 2 decimal places", '.cast("decimal(10,2)")'),
    (DOUBLE_T, NUMERIC_10, "to whole numbers", '.cast("decimal(10,0)")'),
    (DOUBLE_T, sa.NUMERIC(10, 1), "to 1 decimal place", '.cast("decimal(10,1)")'),
    (DOUBLE_T, sa.NUMERIC(60, 2), "to 2 decimal places", '.cast("decimal(38,2)")'),
    (T.DecimalType(12, 4), NUMERIC_10_2, "to 2 decimal places", '.cast("decimal(10,2)")'),
    (T.DecimalType(10, 2), NUMERIC_10, "to whole numbers", '.cast("decimal(10,0)")'),
    (LONG_T, NUMERIC_5_MINUS_2, "to multiples of 100", '.cast("string")'),
    (DOUBLE_T, REAL, "to the 6 significant digits a real holds", '.cast("float")'),
    (T.DecimalType(7, 2), REAL, "to the 6 significant digits a real holds", '.cast("float")'),
    (T.DecimalType(16, 2), DOUBLE, "to the 15 significant digits a double precision holds",
     '.cast("double")'),
    (INT_T, REAL, "to the 6 significant digits a real holds", '.cast("float")'),
    (LONG_T, REAL, "to the 6 significant digits a real holds", '.cast("float")'),
    (LONG_T, DOUBLE, "to the 15 significant digits a double precision holds", '.cast("double")'),
    (TS_T, TIMESTAMP_3, "to 3 decimal places of a second",
     'F.date_format(F.to_utc_timestamp(F.col("c"), F.current_timezone()), '
     '"yyyy-MM-dd HH:mm:ss.SSS")'),
    (NTZ_T, TIMESTAMP_3, "to 3 decimal places of a second",
     'F.date_format(F.col("c"), "yyyy-MM-dd HH:mm:ss.SSS")'),
    (TS_T, TIMESTAMPTZ_0, "to whole seconds",
     'F.date_format(F.col("c"), "yyyy-MM-dd HH:mm:ssXXX")'),
    (NTZ_T, pg.TIMESTAMP(timezone=True, precision=5), "to 5 decimal places of a second",
     'F.date_format(F.col("c"), "yyyy-MM-dd HH:mm:ss.SSSSS")'),
]  # fmt: skip

EXACT: list[tuple[Any, Any]] = [
    (T.DecimalType(10, 2), NUMERIC_12_2),
    (T.DecimalType(10, 2), NUMERIC_10_4),
    (T.DecimalType(10, 2), NUMERIC_10_2),  # too many integer digits: loud overflow
    (T.DecimalType(38, 10), NUMERIC),
    (T.DecimalType(10, 0), NUMERIC_10),
    (DOUBLE_T, NUMERIC),  # the value's text, held exactly
    (FLOAT_T, NUMERIC),
    (INT_T, NUMERIC_10_2),
    (LONG_T, NUMERIC_10),
    (FLOAT_T, REAL),
    (FLOAT_T, DOUBLE),
    (DOUBLE_T, DOUBLE),
    (BYTE_T, REAL),
    (SHORT_T, REAL),
    (INT_T, DOUBLE),
    (T.DecimalType(6, 2), REAL),
    (T.DecimalType(15, 2), DOUBLE),
    (TS_T, TIMESTAMP),
    (TS_T, TIMESTAMP_6),
    (NTZ_T, TIMESTAMP),
    (TS_T, TIMESTAMPTZ),
    (T.DateType(), TIMESTAMPTZ_0),  # midnight has no fraction
    (T.StringType(), NUMERIC_10_2),  # a string is PostgreSQL's to parse, rounding included
    (T.StringType(), REAL),
    (T.StringType(), TIMESTAMPTZ_0),
    (T.StringType(), sa.INTEGER()),
    (T.NullType(), NUMERIC_10_2),
    (DOUBLE_T, sa.TEXT()),
    (TS_T, sa.TEXT()),
    (LONG_T, sa.BIGINT()),
]


def _name(pair: Any) -> str:
    spark, column, *_ = pair
    return f"{spark.simpleString()}->{column}"


@pytest.mark.parametrize("pair", LOSSY, ids=[_name(p) for p in LOSSY])
def test_pairs_postgresql_would_round_are_lossy(pair: tuple[Any, Any, str, str]) -> None:
    spark, column, what, remedy = pair
    lost = loss(spark, column)
    assert lost is not None
    assert lost.what == f"{ROUNDED} {what}"
    assert remedy in lost.remedy("c")


@pytest.mark.parametrize("pair", EXACT, ids=[_name(p) for p in EXACT])
def test_exact_pairs_lose_nothing(pair: tuple[Any, Any]) -> None:
    spark, column = pair
    assert loss(spark, column) is None


def test_the_remedy_in_pyspark_and_in_a_sinks_select() -> None:
    lost = loss(DOUBLE_T, NUMERIC_10_2)
    assert lost is not None
    assert lost.remedy("price") == (
        'cast it in the query so the rounding is yours: F.col("price").cast("decimal(10,2)") '
        "(in a sink's select: CAST(price AS decimal(10,2)) AS price)"
    )
    assert lost.remedy("unit `price`").endswith(
        "CAST(`unit ``price``` AS decimal(10,2)) AS `unit ``price```)"
    )
    stamp = loss(TS_T, TIMESTAMP_3)
    assert stamp is not None
    assert stamp.remedy("at") == (  # its UTC wall clock, as the sink stores an instant there
        "format it as text in the query so the rounding is yours: "
        'F.date_format(F.to_utc_timestamp(F.col("at"), F.current_timezone()), '
        '"yyyy-MM-dd HH:mm:ss.SSS") (in a sink\'s select: date_format(to_utc_timestamp(at, '
        "current_timezone()), 'yyyy-MM-dd HH:mm:ss.SSS') AS at)"
    )
    zoned = loss(TS_T, TIMESTAMPTZ_0)
    assert zoned is not None
    assert zoned.remedy("at") == (
        "format it as text in the query so the rounding is yours: "
        'F.date_format(F.col("at"), "yyyy-MM-dd HH:mm:ssXXX") '
        "(in a sink's select: date_format(at, 'yyyy-MM-dd HH:mm:ssXXX') AS at)"
    )
    odd = loss(LONG_T, NUMERIC_5_MINUS_2)  # no Spark decimal has a negative scale
    assert odd is not None
    assert odd.remedy("n").startswith(
        "cast it to a string in the query, for PostgreSQL to parse and round: "
        'F.col("n").cast("string")'
    )


def _info(**columns: Any) -> TargetInfo:
    return TargetInfo(
        TableName("orders", "shop"),
        {n: TargetColumn(n, t, True, False, False) for n, t in columns.items()},
        ("id",),
    )


def test_the_plan_refuses_a_lossy_pair_naming_column_types_table_and_cast() -> None:
    info = _info(id=sa.BIGINT(), amount=NUMERIC_10_2)
    with pytest.raises(PlanError) as refused:
        check_batch(info, [("id", "id"), ("price", "amount")], {"id": LONG_T, "price": DOUBLE_T})
    assert str(refused.value) == (
        "batch column 'price' (double) cannot be written to column amount of table "
        "shop.orders (NUMERIC(10, 2)) without loss: PostgreSQL would round its values to 2 "
        'decimal places; cast it in the query so the rounding is yours: F.col("price")'
        '.cast("decimal(10,2)") (in a sink\'s select: CAST(price AS decimal(10,2)) AS price), '
        "or change the column's type"
    )
    assert refused.value.columns == ["price"]
    check_batch(
        info,
        [("id", "id"), ("price", "amount")],
        {"id": LONG_T, "price": T.DecimalType(10, 2)},
    )
