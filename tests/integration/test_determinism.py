"""Which plans fanout calls volatile for a sink that partitions by some columns: Spark's
non-deterministic expressions and per-execution clocks, followed column by column, so a
keyed sink may carry them in its other columns (fanout.partitioned.determinism;
real Spark plans)."""

from __future__ import annotations

from typing import Any

import pytest

from fanout.errors import PartitioningError
from fanout.partitioned.determinism import check_route, volatile_in_plan
from fanout.partitioned.membership import WHOLE_ROW
from fanout.routes.route import Route


def _volatile(df: Any) -> list[str]:
    return volatile_in_plan(df._jdf.queryExecution().analyzed())[0]


def test_columns_are_followed_through_aliases_sorts_joins_and_aggregations(spark: Any) -> None:
    base = spark.range(10).selectExpr("id", "uuid() AS u", "id % 3 AS g")
    other = spark.range(5).withColumnRenamed("id", "k")
    assert _volatile(base.select("id")) == []
    assert _volatile(base.alias("x").orderBy("id").select("id")) == []
    assert _volatile(base.join(other, base.id == other.k).select("id", "k")) == []
    assert _volatile(base.groupBy("g").agg({"u": "max"}).select("g")) == []
    assert _volatile(base.alias("x").select("u")) == ["uuid() AS u"]
    assert _volatile(base.groupBy("g").agg({"u": "max"})) == ["uuid() AS u"]


def test_filters_and_per_execution_clocks_count(spark: Any) -> None:
    base = spark.range(10)
    assert _volatile(base.where("rand() < 0.5")) == ["(rand() < CAST(0.5BD AS DOUBLE))"]
    assert _volatile(base.selectExpr("id", "current_timestamp() AS at")) == ["current_timestamp()"]
    assert _volatile(base.selectExpr("id", "current_date() AS d").select("id")) == []


def test_route_check_at_construction(spark: Any) -> None:
    keyless = Route(select=("*", "amount * 100 + rand() AS noisy"))
    with pytest.raises(PartitioningError) as refused:
        check_route("events", keyless, WHOLE_ROW, spark)
    assert str(refused.value).startswith(
        "sink 'events': route select expression 'amount * 100 + rand() AS noisy' is not "
        "deterministic"
    )
    check_route("events", keyless, ["order_id"], spark)  # keyed: its key is not touched
    with pytest.raises(PartitioningError, match="route where 'rand\\(\\) < 0.1'"):
        check_route("events", Route(where="rand() < 0.1"), ["order_id"], spark)
    check_route("events", Route(where="amount > 3 AND status LIKE 'p%'"), WHOLE_ROW, spark)
    check_route("events", keyless, None, spark)  # a sink committing batches whole
