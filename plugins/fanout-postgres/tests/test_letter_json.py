"""A PostgreSQL sink's dead letters hold the row as every dead-letter target does (the core's
``letter_json``): a row its table refuses (a CHECK) and a row failing its route, in a
``postgres:`` table and in a Delta table alike; Spark's ``from_json`` reads them back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pgcheck import execute, query

from fanout import BatchInfo, FanOut
from fanout.contract.dead_letters import letter_rows
from fanout.deadletters.layout import letter_json
from tests.integration.streams import delta_rows

DDL = (
    "CREATE TABLE items (id bigint PRIMARY KEY, b bytea, mb jsonb, mi jsonb, ms jsonb, "
    "x float8, s jsonb, d date, qty integer CHECK (qty > 0))"
)
# one row the table takes (1), one its CHECK refuses (2), one failing the route (3)
BATCH = """
select id, X'FF0001' as b, map(X'FF', 1) as mb, map(1, 'a', 2, 'b') as mi,
    map('k', X'FE') as ms, double('NaN') as x,
    named_struct('at', timestamp'2024-01-02 08:34:05.123456 Asia/Kolkata') as s,
    date'0999-12-31' as d, qty
from values (1L, '5'), (2L, '-1'), (3L, 'abc') as t(id, qty)
"""
SELECT = ["id", "b", "mb", "mi", "ms", "x", "s", "d", "CAST(qty AS INT) AS qty"]
# a map's binary key is its base64, an int key its JSON text; an instant in UTC
ROW = (
    '{{"id": {id}, "b": "/wAB", "mb": {{"/w==": 1}}, "mi": {{"1": "a", "2": "b"}}, '
    '"ms": {{"k": "/g=="}}, "x": "NaN", "s": {{"at": "2024-01-02T03:04:05.123456+00:00"}}, '
    '"d": "0999-12-31", "qty": {qty}}}'
)
REFUSED = ROW.format(id=2, qty=-1)
ROUTED = ROW.format(id=3, qty='"abc"')
# from_json reads no map whose keys are not strings: the round trip leaves out mb and mi
READ_BACK = "id LONG, b BINARY, ms MAP<STRING, BINARY>, x DOUBLE, s STRUCT<at: TIMESTAMP>, " \
    "d DATE, qty INT"  # fmt: skip


def _write(spark: Any, pg_url: str, dead_letter: str, ledger: Path) -> Any:
    execute(pg_url, DDL)
    sink = {"type": "postgres", "name": "pg", "url": pg_url, "table": "items", "keys": ["id"],
            "partitions": 1, "dead_letter": dead_letter, "select": SELECT}  # fmt: skip
    fan = FanOut("letters", str(ledger), [sink], retries=0)
    result = fan.process(spark.sql(BATCH), BatchInfo("letters", 4, "q"))["pg"]
    assert (result.rows, result.dead_lettered) == (1, 2)
    assert query(pg_url, "SELECT id, qty FROM items") == [(1, 5)]
    return result


def _postgres_letters(pg_url: str) -> list[tuple[Any, ...]]:
    return query(
        pg_url,
        "SELECT partition, column_name, value, row, row::text FROM rejects ORDER BY row->'id'",
    )


def _delta_letters(path: Path) -> list[dict[str, Any]]:
    return sorted(delta_rows(path), key=lambda d: json.loads(d["row"])["id"])


def test_a_postgres_table_holds_the_core_s_row_json(spark: Any, pg_url: str, tmp_path: Path):
    _write(spark, pg_url, "postgres:rejects", tmp_path / "ledger")
    letters = _postgres_letters(pg_url)
    # jsonb orders an object's keys its own way: compared as JSON values
    assert [letter[:4] for letter in letters] == [
        (0, "qty", "-1", json.loads(REFUSED)),
        (-1, "qty", "abc", json.loads(ROUTED)),
    ]
    # the table's own jsonb: a binary map key as hex, as a binary value in it
    assert query(pg_url, "SELECT mb, ms FROM items") == [({"\\xff": 1}, {"k": "\\xfe"})]


def test_a_delta_table_holds_the_core_s_row_json(spark: Any, pg_url: str, tmp_path: Path):
    _write(spark, pg_url, str(tmp_path / "dead"), tmp_path / "ledger")
    letters = _delta_letters(tmp_path / "dead")
    assert [(d["source"], d["column"], d["value"], d["row"]) for d in letters] == [
        ("refused", "qty", "-1", REFUSED),  # value: the cell's JSON, as any Delta letter's
        ("route", "qty", '"abc"', ROUTED),
    ]
    # the very text the core writes for the batch's row
    routed = spark.sql(BATCH).filter("id = 2").selectExpr(*SELECT).toArrow()
    assert letters[0]["row"] == letter_json(letter_rows(routed)[0])


@pytest.mark.parametrize("kind", ["postgres", "delta"])
def test_from_json_reads_a_refused_row_back_as_the_batch_had_it(
    spark: Any, pg_url: str, tmp_path: Path, kind: str
) -> None:
    from pyspark.sql import functions as F

    dead = "postgres:rejects" if kind == "postgres" else str(tmp_path / "dead")
    _write(spark, pg_url, dead, tmp_path / "ledger")
    if kind == "postgres":
        text = _postgres_letters(pg_url)[0][4]
    else:
        text = _delta_letters(tmp_path / "dead")[0]["row"]
    back = spark.createDataFrame([(text,)], "row string").select(
        F.from_json("row", READ_BACK).alias("r")
    )
    columns = ["id", "b", "ms", "x", "s", "d", "qty"]
    batch = spark.sql(BATCH).filter("id = 2").selectExpr(*SELECT).select(*columns)
    # repr: NaN equals itself there
    assert repr(back.select("r.*").toArrow().to_pylist()) == repr(batch.toArrow().to_pylist())
    assert back.select("r.b").first()[0] == bytearray(b"\xff\x00\x01")
