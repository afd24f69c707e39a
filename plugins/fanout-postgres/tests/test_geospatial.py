"""A Spark ``GEOMETRY`` or ``GEOGRAPHY`` (Spark 4.1+) reaches the sink as the
``struct<srid, wkb>`` of its stored form: at the top it was refused with advice Spark
cannot follow (``CAST`` to a string), inside a struct, array or map it was written into
``json``/``jsonb`` as ``{"srid": 0, "wkb": "\\x..."}`` without an error. Both are refused
before any row is written, naming the column and the fix: its WKB, ``ST_AsBinary``."""

from __future__ import annotations

from typing import Any

import pytest
from fanout_postgres import PostgresSink
from pgcheck import execute, query

from fanout.contract.batch import Batch, BatchInfo
from fanout.errors import SchemaMismatchError
from fanout.testing import open_sink

POINT = "X'0101000000000000000000F03F0000000000000040'"  # POINT (1 2), little-endian WKB
POINT_BYTES = bytes.fromhex("0101000000000000000000F03F0000000000000040")


def _write(spark: Any, url: str, sql: str, **options: Any) -> Any:
    sink = open_sink(PostgresSink("pg", url=url, table="places", partitions=1, **options), "geo")
    return sink.write(Batch(spark.sql(sql), BatchInfo("geo", 0, "q"), "pg", "fanout/geo/pg"))


def test_a_nested_geometry_is_refused_not_written_as_its_struct(spark: Any, pg_url: str) -> None:
    execute(pg_url, "CREATE TABLE places (id bigint PRIMARY KEY, s jsonb)")
    sql = f"SELECT 1L AS id, named_struct('name', 'x', 'at', ST_GeomFromWKB({POINT})) AS s"
    with pytest.raises(SchemaMismatchError) as refused:
        _write(spark, pg_url, sql)
    assert str(refused.value) == (
        "sink 'pg', batch 0: batch column 's' (struct<name:string,at:geometry(0)>) cannot be "
        "written: it holds a Spark GEOMETRY at s.at, which would reach PostgreSQL as the "
        "struct of its stored form, not as its value; write its WKB in the query: "
        "ST_AsBinary of the value at s.at"
    )
    assert refused.value.columns == ["s"]
    assert query(pg_url, "SELECT count(*) FROM places") == [(0,)]


def test_a_geography_column_is_refused_naming_st_asbinary(spark: Any, pg_url: str) -> None:
    execute(pg_url, "CREATE TABLE places (id bigint PRIMARY KEY, g bytea)")
    with pytest.raises(SchemaMismatchError) as refused:
        _write(spark, pg_url, f"SELECT 1L AS id, ST_GeogFromWKB({POINT}) AS g")
    assert str(refused.value) == (
        "sink 'pg', batch 0: batch column 'g' (geography(4326)) cannot be written: it holds "
        "a Spark GEOGRAPHY, which would reach PostgreSQL as the struct of its stored form, "
        "not as its value; write its WKB in the query: ST_AsBinary(g) AS g (into a bytea "
        "column; its SRID with ST_SRID)"
    )
    # the fix the error names
    _write(spark, pg_url, f"SELECT 1L AS id, ST_AsBinary(ST_GeogFromWKB({POINT})) AS g")
    assert [(i, bytes(g)) for i, g in query(pg_url, "SELECT id, g FROM places")] == [
        (1, POINT_BYTES)
    ]


def test_create_table_makes_no_table_for_a_geometry_in_an_array(spark: Any, pg_url: str) -> None:
    sql = f"SELECT 1L AS id, array(ST_GeomFromWKB({POINT})) AS a"
    with pytest.raises(SchemaMismatchError) as refused:
        _write(spark, pg_url, sql, create_table=True, keys="id")
    assert str(refused.value).endswith(
        "batch column 'a' (array<geometry(0)>) cannot be written: it holds a Spark GEOMETRY "
        "at a[], which would reach PostgreSQL as the struct of its stored form, not as its "
        "value; write its WKB in the query: ST_AsBinary of the value at a[]"
    )
    assert query(pg_url, "SELECT to_regclass('places') IS NULL") == [(True,)]
