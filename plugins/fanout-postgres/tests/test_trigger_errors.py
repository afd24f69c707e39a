"""A trigger refusing a row: a plain ``RAISE EXCEPTION`` (SQLSTATE P0001) is no row's
fault to the sink, so the partition fails at every attempt, ``dead_letter`` or not, its
error saying how to raise instead; raised ``USING ERRCODE = 'check_violation'`` (class 23)
the row is refused like one a CHECK constraint refuses: dead-lettered, the rest written.

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

from fanout.partitioned.membership import MemberDigest
from fanout.partitioned.outcome import PartitionOutcome
from fanout.partitioned.task import CommitHooks
from fanout.testing import open_sink

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.LongType())])


def _table(url: str, using: str) -> None:
    execute(url, "CREATE TABLE t (id bigint PRIMARY KEY, v bigint)")
    execute(
        url,
        "CREATE FUNCTION no_negative() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        f"IF NEW.v < 0 THEN RAISE EXCEPTION 'negative v %', NEW.v {using}; END IF; "
        "RETURN NEW; END $$",
    )
    execute(url, "CREATE TRIGGER no_negative BEFORE INSERT OR UPDATE ON t FOR EACH ROW "
                 "EXECUTE FUNCTION no_negative()")  # fmt: skip


def _write(url: str, mode: str) -> PartitionOutcome:
    sink = PostgresSink("pg", url=url, table="t", mode=mode, dead_letter="postgres:rejects")
    sink = open_sink(sink, "trg")
    writer = PostgresPartitionWriter(sink.connection_url(), write_plan(sink, SCHEMA, 0),
                                     BatchMeta("trg", 0, "q"), mode == "upsert", 0.0)  # fmt: skip
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": pa.array([5, -1, 7], pa.int64())})
    return writer.write_partition(0, iter(rows.to_batches()), CommitHooks("trg", "pg", 0),
                                  MemberDigest())  # fmt: skip


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_trigger_raising_a_check_violation_dead_letters_the_row(pg_url: str, mode: str) -> None:
    _table(pg_url, "USING ERRCODE = 'check_violation'")
    outcome = _write(pg_url, mode)
    assert (outcome.status, outcome.rows, outcome.dead_lettered) == ("committed", 2, 1), outcome
    assert query(pg_url, "SELECT id, v FROM t ORDER BY id") == [(1, 5), (3, 7)]
    assert query(pg_url, "SELECT reason, row FROM rejects") == [
        ("negative v -1", {"id": 2, "v": -1})
    ]


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_trigger_s_plain_raise_fails_the_partition_saying_how_to_raise(
    pg_url: str, mode: str
) -> None:
    _table(pg_url, "")
    outcome = _write(pg_url, mode)
    assert outcome.status == "failed" and outcome.failure is not None
    assert (outcome.failure.kind, outcome.failure.transient) == ("fatal", False)
    assert outcome.failure.details == {"sqlstate": "P0001"}
    message = outcome.failure.message
    assert message.startswith("RaiseException: negative v -1\n")
    assert message.endswith(
        "(SQLSTATE P0001: RAISE EXCEPTION without an ERRCODE, in a trigger or a function the "
        "statement called, is no row's fault to the sink: the partition fails at every "
        "attempt, dead_letter or not. To have the row refused (dead-lettered, or the batch "
        "failing naming it), raise it with a data error's code: RAISE EXCEPTION '...' USING "
        "ERRCODE = 'check_violation' (any code of class 23 or 22))"
    )
    assert query(pg_url, "SELECT count(*) FROM t") == [(0,)]
