"""Upsert records of refused rows in a PostgreSQL dead-letter table stay one per row when
one batch is written more than once: two attempts of one partition running at the same
time (a speculative or zombie task), and a replay with another ``partitions``."""

from __future__ import annotations

import threading
import time
from typing import Any

import pyarrow as pa
import pytest
from commit_hooks import CommitGate, NoCommitHooks
from fanout_postgres import PostgresSink
from pgcheck import execute, query, waiting_on_a_lock

from fanout.contract.batch import Batch, BatchInfo
from fanout.partitioned.membership import MemberDigest
from fanout.partitioned.outcome import PartitionOutcome
from fanout.testing import open_sink

DDL = "CREATE TABLE t (id bigint PRIMARY KEY, name text NOT NULL)"
SCHEMA = "id LONG, name STRING"
ARROW = pa.schema([("id", pa.int64()), ("name", pa.string())])


pytestmark = pytest.mark.usefixtures("no_kept_connections")


def _sink(url: str, **options: Any) -> PostgresSink:
    sink = PostgresSink("pg", url=url, table="t", dead_letter="postgres:rejects", **options)
    return open_sink(sink, "att")


def _batch(spark: Any, rows: list[tuple[Any, ...]], batch_id: int = 0) -> Batch:
    df = spark.createDataFrame(rows, SCHEMA)
    return Batch(df, BatchInfo("att", batch_id, "q"), "pg", "fanout/att/pg")


def _letters(url: str) -> list[tuple[Any, ...]]:
    return query(url, "SELECT (row->>'id')::bigint, count(*) FROM rejects GROUP BY 1 ORDER BY 1")


@pytest.mark.parametrize(
    "existing, rows",
    [
        pytest.param([], [(7, None)], id="every-row-refused"),
        pytest.param([(1, "x")], [(1, "x"), (7, None)], id="every-other-row-unchanged"),
    ],
)
def test_two_attempts_of_one_partition_at_once_leave_its_letters_once(
    spark: Any, pg_url: str, existing: list[tuple[Any, ...]], rows: list[tuple[Any, ...]]
) -> None:
    """The partitions' transactions take no row lock in common (a refused row writes
    nothing, MERGE locks no unchanged row): the second attempt waits for the first on an
    advisory lock before replacing the partition's letters, so it deletes the first's."""
    execute(pg_url, DDL, *[f"INSERT INTO t VALUES ({i}, '{n}')" for i, n in existing])
    writer = _sink(pg_url, partitions=1).partition_writer(_batch(spark, rows), None)
    table = pa.Table.from_pylist([{"id": i, "name": n} for i, n in rows], schema=ARROW)
    gate = CommitGate()
    outcomes: dict[str, PartitionOutcome] = {}

    def attempt(name: str, hooks: Any) -> None:
        outcomes[name] = writer.write_partition(0, iter(table.to_batches()), hooks, MemberDigest())

    first = threading.Thread(target=attempt, args=("first", gate))
    first.start()
    assert gate.reached.wait(60), "the first attempt never reached its commit"
    second = threading.Thread(target=attempt, args=("second", NoCommitHooks()))
    second.start()
    deadline = time.monotonic() + 30
    while second.is_alive() and not waiting_on_a_lock(pg_url) and time.monotonic() < deadline:
        time.sleep(0.05)
    gate.opened.set()
    first.join(60)
    second.join(60)

    assert [o.status for o in (outcomes["first"], outcomes["second"])] == ["committed"] * 2
    assert _letters(pg_url) == [(7, 1)]
    assert query(pg_url, "SELECT * FROM t ORDER BY id") == existing


def _partition_of(spark: Any, ids: list[int], partitions: int) -> dict[int, int]:
    from pyspark.sql import functions as F

    df = spark.createDataFrame([(i,) for i in ids], "id LONG").repartition(partitions, "id")
    return {r[0]: r[1] for r in df.select("id", F.spark_partition_id()).collect()}


def test_a_replay_with_fewer_partitions_leaves_each_letter_once(spark: Any, pg_url: str) -> None:
    execute(pg_url, DDL)
    rows = [(i, None if i in (5, 6, 7, 8) else "n") for i in range(40)]
    for partitions in (4, 2):
        result = _sink(pg_url, partitions=partitions).write(_batch(spark, rows))
        assert result.dead_lettered == 4
    assert _letters(pg_url) == [(5, 1), (6, 1), (7, 1), (8, 1)]
    assert query(pg_url, "SELECT max(partition) FROM rejects") == [(1,)]
    assert query(pg_url, "SELECT count(*) FROM t") == [(36,)]


def test_a_replay_whose_partition_is_now_empty_drops_its_earlier_letters(
    spark: Any, pg_url: str
) -> None:
    """Batch 0 first in one partition, replayed in eight: its refused rows land outside
    partition 0, which is empty now and writes nothing, so its earlier letters go."""
    execute(pg_url, DDL)
    where = _partition_of(spark, list(range(40)), 8)
    bad = [i for i in sorted(where) if where[i] != 0][:2]
    rows = [(i, None) for i in bad]
    for partitions in (1, 8):
        result = _sink(pg_url, partitions=partitions).write(_batch(spark, rows))
        assert result.dead_lettered == 2
    assert _letters(pg_url) == [(bad[0], 1), (bad[1], 1)]
    assert 0 not in result.details["committed_partitions"]
    # the route's records (partition -1) of the batch are not the partitions' to delete
    execute(pg_url, "INSERT INTO rejects (pipeline, sink, batch_id, partition, target, reason, "
                    "row) VALUES ('att', 'pg', 0, -1, 't', 'route', '{}')")  # fmt: skip
    _sink(pg_url, partitions=8).write(_batch(spark, rows))
    assert query(pg_url, "SELECT count(*) FROM rejects WHERE partition = -1") == [(1,)]
