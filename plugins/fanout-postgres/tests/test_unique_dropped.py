"""An upsert whose keys lost their unique constraint since the write plan was made (dropped,
or dropped and not yet added again by a migration) must not write: a ``COPY`` straight into
the table, which only the unique index makes fail for a key already there, would append
every such key again (the ``MERGE`` would not notice either). The next batch's plan refuses
the keys, and a partition whose plan was made before the drop rolls back (transient: the
batch is planned anew). Without this, each key of the batch was silently written twice.

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

from fanout.errors import SchemaMismatchError
from fanout.partitioned.membership import MemberDigest
from fanout.partitioned.outcome import PartitionOutcome
from fanout.partitioned.task import CommitHooks
from fanout.testing import open_sink

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.LongType())])


def _write(sink: PostgresSink, plan: object, rows: list[tuple[int, int]], batch_id: int
           ) -> PartitionOutcome:  # fmt: skip
    writer = PostgresPartitionWriter(sink.connection_url(), plan, BatchMeta("ud", batch_id, "q"),
                                     True, 0.0)  # fmt: skip
    ids, values = zip(*rows, strict=True)
    table = pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array(values, pa.int64())})
    hooks = CommitHooks("ud", "pg", batch_id)
    return writer.write_partition(0, iter(table.to_batches()), hooks, MemberDigest())


def test_keys_that_lost_their_unique_constraint_are_not_written_twice(pg_url: str) -> None:
    execute(pg_url, "CREATE TABLE t (id bigint CONSTRAINT t_pk PRIMARY KEY, v bigint)")
    sink = open_sink(PostgresSink("pg", url=pg_url, table="t"), "ud")
    plan = write_plan(sink, SCHEMA, 0)
    assert _write(sink, plan, [(1, 1), (2, 2)], 0).status == "committed"
    execute(pg_url, "ALTER TABLE t DROP CONSTRAINT t_pk")

    # a partition planned before the drop: rolled back, for the batch to be planned anew
    outcome = _write(sink, plan, [(1, 10), (3, 3)], 1)
    assert outcome.status == "failed" and outcome.failure is not None
    assert (outcome.failure.kind, outcome.failure.transient) == ("transient", True)
    assert "no longer has a unique index on the keys (id)" in outcome.failure.message
    assert query(pg_url, "SELECT id, v FROM t ORDER BY id") == [(1, 1), (2, 2)]

    # the batch planned anew: the keys are refused
    with pytest.raises(SchemaMismatchError, match="table t has no primary key"):
        write_plan(sink, SCHEMA, 1)
