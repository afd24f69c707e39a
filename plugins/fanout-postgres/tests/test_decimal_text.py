"""A Spark decimal written to a text column is the text Spark's ``CAST(d AS STRING)`` and
PostgreSQL's ``numeric`` print, in plain notation with the type's scale
(``0.000000000000000000``, ``0.000000100000000000``), never Arrow's scientific notation
(``0E-18``, ``1.00000000000E-7``), which the CSV ``COPY`` sent for a value below 10^-6 or a
zero of scale above 6; a ``numeric`` column holds the same value either way.

Driven through the partition writer (a real plan from a real server, Arrow rows, no Spark).
"""

from __future__ import annotations

from decimal import Decimal

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

VALUES = ["0", "0.0000001", "-0.000000000000000001", "1.5", "12345678901234567890.5"]
SPARK_TEXT = [  # CAST(CAST(v AS DECIMAL(38,18)) AS STRING), as Spark 4 prints it
    "0.000000000000000000",
    "0.000000100000000000",
    "-0.000000000000000001",
    "1.500000000000000000",
    "12345678901234567890.500000000000000000",
]


def test_a_decimal_into_a_text_column_is_written_in_plain_notation(pg_url: str) -> None:
    execute(pg_url, "CREATE TABLE amounts (id bigint PRIMARY KEY, t text, n numeric)")
    decimal = T.DecimalType(38, 18)
    schema = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField("t", decimal),
         T.StructField("n", decimal)]
    )  # fmt: skip
    sink = open_sink(PostgresSink("pg", url=pg_url, table="amounts"), "dec")
    writer = PostgresPartitionWriter(sink.connection_url(), write_plan(sink, schema, 0),
                                     BatchMeta("dec", 0, "q"), True, 0.0)  # fmt: skip
    values = pa.array([Decimal(v) for v in VALUES], pa.decimal128(38, 18))
    rows = pa.table({"id": pa.array(range(len(VALUES)), pa.int64()), "t": values, "n": values})
    outcome = writer.write_partition(
        0, iter(rows.to_batches()), CommitHooks("dec", "pg", 0), MemberDigest()
    )
    assert (outcome.status, outcome.rows) == ("committed", len(VALUES)), outcome.failure
    stored = query(pg_url, "SELECT t, n::text FROM amounts ORDER BY id")
    assert stored == [(text, text) for text in SPARK_TEXT]
