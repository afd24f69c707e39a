"""A table whose constraints are ``DEFERRABLE INITIALLY DEFERRED`` is checked row by row as
any other: a deferred foreign key or unique index is checked at the end of each statement
(``SET CONSTRAINTS ALL IMMEDIATE`` in every partition transaction), so a refused row goes to
the dead-letter target with its column and value instead of failing the commit, and with
it the whole partition, at every attempt. Upsert keys that only a deferrable constraint
makes unique are refused when the sink opens (``ON CONFLICT`` cannot use it as arbiter).

Driven through the partition writer (a real plan from a real server, Arrow rows, no Spark).
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from fanout_postgres import PostgresSink
from fanout_postgres.task import PostgresPartitionWriter
from fanout_postgres.transaction import BatchMeta
from pgcheck import execute, query
from pyspark.sql import types as T
from write_plan import write_plan

from fanout.errors import ConfigurationError
from fanout.partitioned.membership import MemberDigest
from fanout.partitioned.outcome import PartitionOutcome
from fanout.partitioned.task import CommitHooks
from fanout.testing import open_sink

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("parent", T.LongType())])
DEFERRED = "DEFERRABLE INITIALLY DEFERRED"


def _write(url: str, mode: str, rows: list[tuple[int, int]], batch_id: int) -> PartitionOutcome:
    """One partition of batch ``batch_id``, written as an executor writes it."""
    sink = PostgresSink("pg", url=url, table="kids", mode=mode, dead_letter="postgres:rejects")
    sink = open_sink(sink, "deferred")
    meta = BatchMeta("deferred", batch_id, "q")
    direct = mode == "upsert"  # the COPY straight into the table first, as the driver asks
    writer = PostgresPartitionWriter(sink.connection_url(), write_plan(sink, SCHEMA, batch_id),
                                     meta, direct, 0.0)  # fmt: skip
    ids, parents = zip(*rows, strict=True)
    table = pa.table({"id": pa.array(ids, pa.int64()), "parent": pa.array(parents, pa.int64())})
    hooks = CommitHooks("deferred", "pg", batch_id)
    return writer.write_partition(0, iter(table.to_batches()), hooks, MemberDigest())


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_row_a_deferred_foreign_key_refuses_is_dead_lettered(pg_url: str, mode: str) -> None:
    execute(
        pg_url,
        "CREATE TABLE parents (id bigint PRIMARY KEY)",
        "INSERT INTO parents VALUES (1)",
        f"CREATE TABLE kids (id bigint PRIMARY KEY, parent bigint REFERENCES parents {DEFERRED})",
    )
    outcome = _write(pg_url, mode, [(1, 1), (2, 9), (3, 1)], 0)
    assert (outcome.status, outcome.rows, outcome.dead_lettered) == ("committed", 2, 1), outcome
    assert query(pg_url, "SELECT id, parent FROM kids ORDER BY id") == [(1, 1), (3, 1)]
    assert query(pg_url, "SELECT column_name, value, row::text FROM rejects") == [
        ("parent", "9", '{"id": 2, "parent": 9}')
    ]


def test_upsert_keys_with_a_deferrable_unique_constraint_are_refused(pg_url: str) -> None:
    execute(
        pg_url,
        f"CREATE TABLE kids (id bigint PRIMARY KEY {DEFERRED}, parent bigint)",
        "CREATE UNIQUE INDEX ON kids (id)",  # ON CONFLICT (id) still refuses the deferrable one
    )
    with pytest.raises(ConfigurationError) as caught:
        open_sink(PostgresSink("pg", url=pg_url, table="kids"), "deferred")
    assert str(caught.value) == (
        "postgres sink 'pg' (table kids): keys id of table kids have a DEFERRABLE unique "
        "constraint, which INSERT ... ON CONFLICT cannot use as its arbiter; drop it and add "
        "it again NOT DEFERRABLE"
    )


def test_a_row_a_deferred_unique_constraint_refuses_is_dead_lettered(pg_url: str) -> None:
    execute(pg_url, f"CREATE TABLE kids (id bigint PRIMARY KEY, parent bigint UNIQUE {DEFERRED})")
    assert _write(pg_url, "upsert", [(1, 1), (2, 2)], 0).status == "committed"
    # key 1 is in the table (updated); key 3 takes parent 2, which key 2 holds
    outcome = _write(pg_url, "upsert", [(1, 10), (3, 2)], 1)
    assert (outcome.status, outcome.rows, outcome.dead_lettered) == ("committed", 1, 1), outcome
    assert query(pg_url, "SELECT id, parent FROM kids ORDER BY id") == [(1, 10), (2, 2)]
    assert query(pg_url, "SELECT column_name, value, row::text FROM rejects") == [
        ("parent", "2", '{"id": 3, "parent": 2}')
    ]
