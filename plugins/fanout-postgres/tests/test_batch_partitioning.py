"""What the PostgreSQL sink tells fanout of its partitioning (so a batch it shares with
other sinks hashing alike is shuffled once): the plan's hash columns under the batch's
names, once a batch of that schema was planned, and nothing before (planning reads the
table, which belongs in the sink's own write)."""

from __future__ import annotations

from typing import Any

from fanout_postgres import PostgresSink
from pgcheck import execute, query

from fanout.contract.batch import Batch, BatchInfo
from fanout.contract.partitions import BatchPartitioning
from fanout.contract.sink import SinkContext


def _written(spark: Any, sink: PostgresSink, df: Any) -> None:
    sink.open(SinkContext("parts", spark))
    assert sink.batch_partitioning(df.schema) is None  # not planned yet: no I/O here
    sink.write(Batch(df, BatchInfo("parts", 0, "q"), sink.name, f"fanout/parts/{sink.name}"))


def test_upsert_keys_are_given_under_the_batch_names(spark: Any, pg_url: str) -> None:
    execute(pg_url, "CREATE TABLE renamed (id bigint PRIMARY KEY, label text)")
    df = spark.createDataFrame([(1, "a"), (2, "b")], "order_id LONG, name STRING")
    sink = PostgresSink(
        "pg", url=pg_url, table="renamed", columns={"order_id": "id", "name": "label"},
        partitions=3,
    )  # fmt: skip
    _written(spark, sink, df)
    assert query(pg_url, "SELECT id, label FROM renamed ORDER BY id") == [(1, "a"), (2, "b")]
    assert sink.batch_partitioning(df.schema) == BatchPartitioning(3, ("order_id",))
    other = spark.createDataFrame([(1, "a", 2)], "order_id LONG, name STRING, extra INT")
    assert sink.batch_partitioning(other.schema) is None  # another schema: not planned


def test_keyless_append_hashes_every_written_column(spark: Any, pg_url: str) -> None:
    execute(pg_url, "CREATE TABLE events (at bigint, what text)")
    df = spark.createDataFrame([(1, "x", 9), (2, "y", 9)], "ts LONG, kind STRING, unused INT")
    sink = PostgresSink(
        "log", url=pg_url, table="events", mode="append", columns={"ts": "at", "kind": "what"},
        partitions=2,
    )  # fmt: skip
    _written(spark, sink, df)
    assert query(pg_url, "SELECT at, what FROM events ORDER BY at") == [(1, "x"), (2, "y")]
    assert sink.batch_partitioning(df.schema) == BatchPartitioning(2, ("ts", "kind"))


def test_the_input_is_the_batch_itself_when_it_holds_the_table_s_columns(
    spark: Any, pg_url: str
) -> None:
    # no projection to build (a py4j call and an analysis of the batch's plan before the
    # job) when every batch column goes, in order, to the table column of its own name
    execute(pg_url, "CREATE TABLE same (order_id bigint PRIMARY KEY, name text)")
    df = spark.createDataFrame([(1, "a")], "order_id LONG, name STRING")
    sink = PostgresSink("same", url=pg_url, table="same", partitions=2)
    sink.open(SinkContext("parts", spark))
    given = sink.partition_input(Batch(df, BatchInfo("parts", 0, "q"), "same", "fanout/p/same"))
    assert given.df is df and list(given.renamed or ()) == [
        ("order_id", "order_id"),
        ("name", "name"),
    ]

    execute(pg_url, "CREATE TABLE other (id bigint PRIMARY KEY, label text)")
    sink = PostgresSink(
        "other", url=pg_url, table="other", columns={"order_id": "id", "name": "label"},
        partitions=2,
    )  # fmt: skip
    sink.open(SinkContext("parts", spark))
    given = sink.partition_input(Batch(df, BatchInfo("parts", 0, "q"), "other", "fanout/p/other"))
    assert given.df is not df and given.df.columns == ["id", "label"]
    assert given.df.collect() == [(1, "a")]
