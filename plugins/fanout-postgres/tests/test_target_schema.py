"""A table named without its schema is written under the schema it resolves to when the
plan is made: a temporary table of the same name, first on the search path (the staging
table ``fanout_stage``, the isolating ``fanout_winners``), cannot take its rows."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from fanout_postgres import PostgresSink
from fanout_postgres.deadletter import PostgresDeadLetters
from fanout_postgres.identifiers import TableName
from fanout_postgres.task import PostgresPartitionWriter
from fanout_postgres.transaction import BatchMeta
from pgcheck import execute, query
from pyspark.sql import types as T
from write_plan import write_plan

from fanout.contract.sink import SinkContext
from fanout.partitioned.membership import MemberDigest

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])


class _Hooks:
    def before(self, partition: int, rows: int, written: int) -> None:
        pass

    def after(self, partition: int, rows: int, written: int) -> None:
        pass


@pytest.mark.parametrize("mode", ["upsert", "append"])
@pytest.mark.parametrize("name", ["fanout_stage", "fanout_winners"])
def test_a_table_named_like_a_temporary_table_gets_its_rows(
    pg_url: str, name: str, mode: str
) -> None:
    execute(pg_url, f"CREATE TABLE {name} (id bigint PRIMARY KEY, v text CHECK (v <> 'bad'))")
    sink = PostgresSink("pg", url=pg_url, table=name, mode=mode)
    dead = PostgresDeadLetters(pg_url, "pg", TableName("rejects"), name)
    sink.open(SinkContext("names", dead_letters=dead))
    writer = PostgresPartitionWriter(
        sink.connection_url(), write_plan(sink, SCHEMA, 0), BatchMeta("names", 0, "q")
    )
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "bad", "c"]})
    out: Any = writer.write_partition(0, iter(rows.to_batches()), _Hooks(), MemberDigest())
    assert (out.status, out.rows, out.dead_lettered) == ("committed", 2, 1)
    assert query(pg_url, f"SELECT id, v FROM public.{name} ORDER BY id") == [(1, "a"), (3, "c")]
    assert query(pg_url, "SELECT row->>'id' FROM rejects") == [("2",)]
