"""A row the ``INSERT`` refuses by a constraint over several columns (a CHECK reading two, a
composite foreign key) names every column of the constraint and their values in the row,
in the error and in the dead letter's ``column``/``value``; a one-column constraint names
its column as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fanout_postgres import PostgresSink
from pgcheck import execute, query

from fanout.contract.batch import Batch, BatchInfo
from fanout.delta_tables.io import read_delta
from fanout.errors import SinkWriteError
from fanout.testing import open_sink

DDL = (
    "CREATE TABLE parents (region text, code integer, PRIMARY KEY (region, code))",
    "INSERT INTO parents VALUES ('eu', 1)",
    "CREATE TABLE spans (id bigint PRIMARY KEY, starts_at integer, ends_at integer, "
    "qty integer CHECK (qty >= 0), region text, code integer, CHECK (starts_at < ends_at), "
    "FOREIGN KEY (region, code) REFERENCES parents (region, code))",
)
SCHEMA = "id LONG, begin INT, finish INT, qty INT, region STRING, code INT"
COLUMNS = {  # the batch's names differ from the table's: the letters use the batch's
    "id": "id",
    "begin": "starts_at",
    "finish": "ends_at",
    "qty": "qty",
    "region": "region",
    "code": "code",
}
GOOD = (1, 1, 2, 0, "eu", 1)
BACKWARDS = (2, 9, 3, 0, "eu", 1)  # CHECK (starts_at < ends_at)
NEGATIVE = (3, 1, 2, -1, "eu", 1)  # CHECK (qty >= 0): one column, as before
ORPHAN = (4, 1, 2, 0, "us", 7)  # FOREIGN KEY (region, code)
CHECK_REASON = 'new row for relation "spans" violates check constraint "spans_check"'
ROW = {"id": 2, "begin": 9, "finish": 3, "qty": 0, "region": "eu", "code": 1}


def _batch(spark: Any, rows: list[tuple[Any, ...]], batch_id: int) -> Batch:
    df = spark.createDataFrame(rows, SCHEMA).coalesce(1)
    return Batch(df, BatchInfo("spans", batch_id, "q"), "pg", "fanout/spans/pg")


def _sink(url: str, mode: str, **options: Any) -> PostgresSink:
    sink = PostgresSink("pg", url=url, table="spans", mode=mode, partitions=1, columns=COLUMNS,
                        **options)  # fmt: skip
    return open_sink(sink, "spans")


@pytest.mark.parametrize("mode", ["upsert", "append"])
def test_a_check_over_two_columns_fails_the_batch_naming_both_and_their_values(
    spark: Any, pg_url: str, mode: str
) -> None:
    execute(pg_url, *DDL)
    with pytest.raises(SinkWriteError) as caught:
        _sink(pg_url, mode).write(_batch(spark, [GOOD, BACKWARDS], 4))
    assert str(caught.value) == (
        "sink 'pg', batch 4: table spans, column 'begin, finish', value "
        f"""'{{"begin": 9, "finish": 3}}': {CHECK_REASON}; row {json.dumps(ROW)}; """
        "nothing of this partition was written. Fix the data, or set option 'dead_letter' "
        "to divert refused rows"
    )
    assert query(pg_url, "SELECT count(*) FROM spans") == [(0,)]


@pytest.mark.parametrize("mode", ["upsert", "append"])
def test_constraints_over_several_columns_name_them_in_a_postgres_dead_letter(
    spark: Any, pg_url: str, mode: str
) -> None:
    execute(pg_url, *DDL)
    sink = _sink(pg_url, mode, dead_letter="postgres:rejects")
    result = sink.write(_batch(spark, [GOOD, BACKWARDS, NEGATIVE, ORPHAN], 5))
    assert (result.rows, result.dead_lettered) == (1, 3)
    assert query(pg_url, "SELECT id FROM spans") == [(1,)]
    dead = query(
        pg_url, "SELECT column_name, value, row->>'id', reason FROM rejects ORDER BY row->>'id'"
    )
    assert dead == [
        ("begin, finish", '{"begin": 9, "finish": 3}', "2",
         CHECK_REASON),
        ("qty", "-1", "3",
         'new row for relation "spans" violates check constraint "spans_qty_check"'),
        ("region, code", '{"region": "us", "code": 7}', "4",
         'insert or update on table "spans" violates foreign key constraint '
         '"spans_region_code_fkey" (Key (region, code)=(us, 7) is not present in table '
         '"parents".)'),
    ]  # fmt: skip


def test_constraints_over_several_columns_name_them_in_a_delta_dead_letter(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    execute(pg_url, *DDL)
    path = str(tmp_path / "rejects")
    sink = _sink(pg_url, "upsert", dead_letter=path)
    result = sink.write(_batch(spark, [GOOD, BACKWARDS, NEGATIVE, ORPHAN], 6))
    assert (result.rows, result.dead_lettered) == (1, 3)
    dead = read_delta(path).sort_by("row").to_pylist()
    assert [(d["column"], d["value"], json.loads(d["row"])["id"]) for d in dead] == [
        ("begin, finish", '{"begin": 9, "finish": 3}', 2),
        ("qty", "-1", 3),
        ("region, code", '{"region": "us", "code": 7}', 4),
    ]
    assert json.loads(dead[0]["row"]) == ROW
