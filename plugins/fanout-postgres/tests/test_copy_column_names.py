"""A value the ``COPY`` refuses is named by its column also when the column's name holds
``": "``, which COPY's error context prints unquoted before ``": "`` and the value
(``COPY c, line 2, column qty: n: "x"``): the letter named the column ``qty``, which the
table has not, and no value.

Driven through the partition writer (a real plan from a real server, Arrow rows, no Spark).
"""

from __future__ import annotations

import pyarrow as pa
from fanout_postgres import PostgresSink
from fanout_postgres.task import PostgresPartitionWriter
from fanout_postgres.transaction import BatchMeta
from pgcheck import execute, query
from pyspark.sql import types as T
from write_plan import write_plan

from fanout.partitioned.membership import MemberDigest
from fanout.partitioned.task import CommitHooks
from fanout.testing import open_sink


def test_a_refused_value_names_a_column_whose_name_holds_a_colon(pg_url: str) -> None:
    execute(pg_url, 'CREATE TABLE c (id bigint PRIMARY KEY, "qty: n" integer)')
    schema = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField("qty: n", T.StringType())]
    )
    sink = PostgresSink("pg", url=pg_url, table="c", mode="append", dead_letter="postgres:rejects")
    sink = open_sink(sink, "colon")
    writer = PostgresPartitionWriter(sink.connection_url(), write_plan(sink, schema, 0),
                                     BatchMeta("colon", 0, "q"), False, 0.0)  # fmt: skip
    rows = pa.table({"id": pa.array([1, 2], pa.int64()), "qty: n": ["1", "x"]})
    hooks = CommitHooks("colon", "pg", 0)
    outcome = writer.write_partition(0, iter(rows.to_batches()), hooks, MemberDigest())
    assert (outcome.status, outcome.rows, outcome.dead_lettered) == ("committed", 1, 1)
    assert query(pg_url, 'SELECT id, "qty: n" FROM c') == [(1, 1)]
    assert query(pg_url, "SELECT column_name, value, reason FROM rejects") == [
        ("qty: n", "x", 'invalid input syntax for type integer: "x"')
    ]
