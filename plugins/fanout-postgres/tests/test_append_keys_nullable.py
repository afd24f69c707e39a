"""In append mode option ``keys`` only chooses the hash partitioning: a row whose key column
is NULL, in a column that takes NULL, is written like any other (it was refused as
``null value in column ... violates not-null constraint``, a constraint the table does not
have: dead-lettered, or the batch failed at every attempt). Upsert keys stay NOT NULL
(``ON CONFLICT`` matches no NULL key: a replay would insert the row again).

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

SCHEMA = T.StructType(
    [T.StructField("customer", T.StringType()), T.StructField("amount", T.LongType())]
)


def _write(url: str, mode: str, rows: pa.Table) -> tuple[str, int, str | None]:
    sink = PostgresSink("pg", url=url, table="sales", mode=mode, keys=["customer"])
    sink = open_sink(sink, "nk")
    writer = PostgresPartitionWriter(sink.connection_url(), write_plan(sink, SCHEMA, 0),
                                     BatchMeta("nk", 0, "q"), False, 0.0)  # fmt: skip
    hooks = CommitHooks("nk", "pg", 0)
    outcome = writer.write_partition(0, iter(rows.to_batches()), hooks, MemberDigest())
    failure = None if outcome.failure is None else outcome.failure.message
    return outcome.status, outcome.rows, failure


ROWS = pa.table({"customer": ["a", None], "amount": pa.array([1, 2], pa.int64())})


def test_an_append_row_with_a_null_key_is_written(pg_url: str) -> None:
    execute(pg_url, "CREATE TABLE sales (customer text, amount bigint)")
    assert _write(pg_url, "append", ROWS) == ("committed", 2, None)
    assert query(pg_url, "SELECT customer, amount FROM sales ORDER BY amount") == [
        ("a", 1),
        (None, 2),
    ]


def test_an_upsert_row_with_a_null_key_is_refused(pg_url: str) -> None:
    execute(pg_url, "CREATE TABLE sales (customer text UNIQUE, amount bigint)")
    assert _write(pg_url, "upsert", ROWS) == (
        "failed",
        0,
        'null value in column "customer" violates not-null constraint',
    )
    assert query(pg_url, "SELECT count(*) FROM sales") == [(0,)]
