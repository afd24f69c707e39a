"""Upsert exactness over streaming batches, replays that change nothing, and one batch
holding a key several times across input partitions."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from fanout_postgres import PostgresSink
from pg_data import SCHEMA, latest, run_stream, write_files
from pgcheck import execute, query, waiting_on_a_lock

from fanout import FanOut
from fanout.contract.batch import Batch, BatchInfo
from fanout.contract.sink import SinkContext
from fanout.errors import SinkWriteError
from tests.integration.streams import committed_marks

TABLE_DDL = (
    "CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL, "
    "amount double precision, version bigint NOT NULL)"
)


def _rows(url: str) -> list[tuple[Any, ...]]:
    return query(url, "SELECT id, customer, amount, version FROM orders ORDER BY id")


def _expected(files: list[list[dict[str, Any]]]) -> list[tuple[Any, ...]]:
    final = latest(files)
    return [(i, r["customer"], r["amount"], r["version"]) for i, r in sorted(final.items())]


def test_upsert_over_batches_is_exact_and_a_replay_changes_nothing(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    execute(pg_url, TABLE_DDL)
    files = write_files(tmp_path / "input", files=5, rows=40, step=20)
    fan = FanOut(
        "pg-upsert",
        str(tmp_path / "ledger"),
        [
            {
                "type": "postgres",
                "name": "pg",
                "url": pg_url,
                "table": "orders",
                "order_by": "version",
                "partitions": 3,
            }
        ],
    )
    run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")

    assert _rows(pg_url) == _expected(files)  # 120 ids; 80 of them updated by a later file
    assert len(_expected(files)) == 120
    assert committed_marks(tmp_path / "ledger", "pg-upsert") == {("pg", b): 1 for b in range(5)}

    # Spark replays the last batch (driver died after the write, before the ledger mark)
    before = query(
        pg_url, "SELECT id, customer, amount, version, xmin::text FROM orders ORDER BY id"
    )
    last = spark.read.schema(SCHEMA).json(str(tmp_path / "input" / "part-0004.json"))
    sink = fan.sinks["pg"]
    result = sink.write(Batch(last, BatchInfo("pg-upsert", 4, "q"), "pg", "fanout/pg-upsert/pg"))
    after = query(
        pg_url, "SELECT id, customer, amount, version, xmin::text FROM orders ORDER BY id"
    )
    assert result.rows == 40
    assert result.details["changed"] == 0
    assert after == before  # same rows, same values, and no row rewritten (same xmin)


def _opened(url: str, **options: Any) -> PostgresSink:
    sink = PostgresSink("pg", url=url, table="orders", **options)
    sink.open(SinkContext("dups"))
    return sink


def test_one_batch_holding_a_key_many_times_across_partitions(spark: Any, pg_url: str) -> None:
    from pyspark.sql import functions as F

    execute(pg_url, TABLE_DDL, "INSERT INTO orders VALUES (3, 'old', 1.0, 0)")
    versions = [4, 1, 5, 2, 3]  # per key, the copies arrive out of order
    rows = [(key, f"k{key}-v{v}", float(key * 10 + v), v) for v in versions for key in range(50)]
    df = spark.createDataFrame(rows, SCHEMA).repartition(4)  # round-robin: copies spread
    spread = (
        df.withColumn("p", F.spark_partition_id())
        .groupBy("id")
        .agg(F.countDistinct("p").alias("n"))
        .agg(F.min("n"))
        .first()[0]
    )
    assert spread >= 2, "every key's copies must come from several input partitions"

    sink = _opened(pg_url, order_by="version", partitions=3)
    result = sink.write(Batch(df, BatchInfo("dups", 0, "q"), "pg", "fanout/dups/pg"))

    assert _rows(pg_url) == [(k, f"k{k}-v5", float(k * 10 + 5), 5) for k in range(50)]
    assert result.rows == 250
    assert result.details["changed"] == 50


def test_duplicate_keys_without_order_by_fail_naming_the_key(spark: Any, pg_url: str) -> None:
    execute(pg_url, TABLE_DDL)
    df = spark.createDataFrame([(7, "a", 1.0, 1), (7, "b", 2.0, 2), (8, "c", 3.0, 1)], SCHEMA)
    sink = _opened(pg_url, partitions=2)
    with pytest.raises(SinkWriteError) as caught:
        sink.write(Batch(df, BatchInfo("dups", 3, "q"), "pg", "fanout/dups/pg"))
    text = str(caught.value)
    assert "sink 'pg', batch 3" in text
    assert '{"id": 7} occurs 2 times' in text
    assert "order_by" in text
    assert query(pg_url, "SELECT id FROM orders WHERE id = 7") == []


def test_a_key_another_session_inserts_meanwhile_is_updated_not_refused(
    spark: Any, pg_url: str
) -> None:
    """MERGE (the fast path) raises a unique violation when another session inserts one of
    its new keys while it runs; the sink then runs INSERT ... ON CONFLICT, which waits and
    updates, so the batch lands whole."""
    import threading

    import psycopg2
    from pgcheck import dsn

    execute(pg_url, TABLE_DDL, "INSERT INTO orders VALUES (1, 'old', 1.0, 0)")
    other = psycopg2.connect(dsn(pg_url))
    with other.cursor() as cur:  # holds key 2 uncommitted: the sink's insert of 2 waits
        cur.execute("INSERT INTO orders VALUES (2, 'theirs', 0.5, 0)")
    rows = [(1, "mine", 10.0, 1), (2, "mine", 20.0, 1), (3, "mine", 30.0, 1)]
    df = spark.createDataFrame(rows, SCHEMA)
    sink = _opened(pg_url, order_by="version", partitions=1)
    outcome: dict[str, Any] = {}

    def write() -> None:
        try:
            outcome["result"] = sink.write(
                Batch(df, BatchInfo("race", 0, "q"), "pg", "fanout/race/pg")
            )
        except Exception as exc:  # reported by the assertion below
            outcome["error"] = exc

    writer = threading.Thread(target=write)
    writer.start()
    deadline = time.monotonic() + 60
    while not waiting_on_a_lock(pg_url) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert waiting_on_a_lock(pg_url), "the sink never waited for the other session's key"
    other.commit()
    other.close()
    writer.join(120)

    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].rows == 3
    assert _rows(pg_url) == [(1, "mine", 10.0, 1), (2, "mine", 20.0, 1), (3, "mine", 30.0, 1)]
