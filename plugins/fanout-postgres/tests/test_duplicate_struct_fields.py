"""A struct with two fields of one name (``named_struct('a', 1, 'a', 2)``, a join's
``struct(l.*, r.*)``): Spark builds it, but cannot hand it over as Arrow, and a JSON object
would keep one value. Up to this version the batch failed in the write's Spark job with
Spark's ``[DUPLICATED_FIELD_NAME_IN_ARROW_STRUCT]``, naming neither sink, batch nor column;
it is refused before anything is written, naming them, the field and what to do, at the
first batch, or at :meth:`open` from option ``batch_schema``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fanout_postgres import PostgresSink
from pgcheck import execute, query

from fanout.contract.batch import Batch, BatchInfo
from fanout.contract.sink import SinkContext
from fanout.errors import ConfigurationError, SchemaMismatchError

REMEDY = (
    "which Spark cannot hand to the sink (Arrow refuses a struct's duplicate field names) "
    "and a JSON object could not hold; rename one of the {name!r} fields in the query "
    "(named_struct or struct(... AS <other name>)), or leave the column out (option "
    "'columns')"
)


def _write(spark: Any, url: str, sql: str, batch_id: int, partitions: int) -> None:
    sink = PostgresSink("pg", url=url, table="docs", partitions=partitions)
    sink.open(SinkContext("dup"))
    try:
        sink.write(Batch(spark.sql(sql), BatchInfo("dup", batch_id, "q"), "pg", "fanout/dup/pg"))
    finally:
        sink.close()


def test_a_struct_with_a_field_twice_is_refused_naming_sink_batch_column_and_field(
    spark: Any, pg_url: str
) -> None:
    execute(pg_url, "CREATE TABLE docs (id bigint PRIMARY KEY, doc jsonb, items jsonb)")
    top = "SELECT 1L AS id, named_struct('a', 1, 'a', 2) AS doc"
    for partitions in (1, 4):
        with pytest.raises(SchemaMismatchError) as caught:
            _write(spark, pg_url, top, 3, partitions)
        assert str(caught.value) == (
            "sink 'pg', batch 3: batch column 'doc' (struct<a:int,a:int>) holds a struct "
            "with two fields named 'a', " + REMEDY.format(name="a")
        )
        assert caught.value.columns == ["doc"]
    nested = (
        "SELECT 1L AS id, named_struct('a', 1) AS doc, "
        "array(named_struct('x', named_struct('b', 'p', 'c', 'q', 'b', 'r'))) AS items"
    )
    with pytest.raises(SchemaMismatchError) as caught:
        _write(spark, pg_url, nested, 4, 1)
    assert str(caught.value) == (
        "sink 'pg', batch 4: batch column 'items' "
        "(array<struct<x:struct<b:string,c:string,b:string>>>) holds a struct at items[].x "
        "with two fields named 'b', " + REMEDY.format(name="b")
    )
    assert query(pg_url, "SELECT count(*) FROM docs") == [(0,)]

    renamed = "SELECT 1L AS id, named_struct('a', 1, 'a_2', 2) AS doc"
    _write(spark, pg_url, renamed, 5, 1)
    assert [(i, json.loads(d)) for i, d in query(pg_url, "SELECT id, doc::text FROM docs")] == [
        (1, {"a": 1, "a_2": 2})
    ]


def test_a_struct_with_a_field_twice_in_batch_schema_is_refused_at_configuration(
    spark: Any, pg_url: str
) -> None:
    execute(pg_url, "CREATE TABLE docs (id bigint PRIMARY KEY, doc jsonb)")
    sink = PostgresSink(
        "pg", url=pg_url, table="docs", batch_schema="id BIGINT, doc STRUCT<a: INT, a: INT>"
    )
    with pytest.raises(ConfigurationError) as caught:
        sink.open(SinkContext("dup", spark))
    assert str(caught.value) == (
        "postgres sink 'pg' (table docs): at configuration (option batch_schema): batch "
        "column 'doc' (struct<a:int,a:int>) holds a struct with two fields named 'a', "
        + REMEDY.format(name="a")
    )
