"""The delta-spark engine's merge deduplication breaks ``order_by`` ties like the rs
engine, by the other columns, not by arrival order (issue 13, item 8). Plain Spark: the
deduplication needs no Delta jars."""

from __future__ import annotations

from typing import Any

import pytest
from fanout_delta.spark_engine import dedupe_spark
from test_delta_merge_ties import FLOAT_ROWS, FLOAT_WINNERS, ROWS, WINNERS

SCHEMA = "id LONG, seq LONG, name STRING, tags ARRAY<STRING>, amount DOUBLE"


@pytest.mark.parametrize("order", ["forward", "backward"])
def test_spark_tie_winner_does_not_depend_on_arrival_order(spark: Any, order: str) -> None:
    arrived = ROWS if order == "forward" else ROWS[::-1]
    df = spark.createDataFrame([tuple(r.values()) for r in arrived], SCHEMA).coalesce(1)

    kept = dedupe_spark(df, ["id"], ["seq"], "s", 0)

    assert sorted((r.asDict() for r in kept.collect()), key=lambda r: r["id"]) == WINNERS


@pytest.mark.parametrize("order", ["forward", "backward"])
def test_spark_and_rs_agree_on_float_keys_and_nan(spark: Any, order: str) -> None:
    """Spark matches ``0.0`` with ``-0.0`` and NaN with NaN, and orders NaN greatest: the
    rs engine's preparation (``FLOAT_WINNERS``) picks the same rows."""
    arrived = FLOAT_ROWS if order == "forward" else FLOAT_ROWS[::-1]
    df = spark.createDataFrame(
        [tuple(r.values()) for r in arrived], "id DOUBLE, seq DOUBLE, amount DOUBLE"
    ).coalesce(1)

    kept = dedupe_spark(df, ["id"], ["seq"], "s", 0)

    assert sorted(str(r.asDict()) for r in kept.collect()) == FLOAT_WINNERS
