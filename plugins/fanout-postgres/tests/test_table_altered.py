"""A table altered while the stream runs (``ALTER TABLE ... TYPE``): each batch checks the
table's columns against its cached write plan and plans anew when they changed; a plan gone
stale within a batch never writes a wrong value (the staging table has the planned types,
which binary COPY encodes, and the INSERT casts them, or fails)."""

from __future__ import annotations

import dataclasses
import pickle
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from fanout_postgres import PostgresSink
from fanout_postgres.sqlstate import classify
from fanout_postgres.task import PostgresPartitionWriter
from fanout_postgres.transaction import BatchMeta
from pgcheck import execute, query
from pyspark.sql import types as T
from write_plan import write_plan

from fanout.contract.batch import Batch, BatchInfo
from fanout.contract.sink import SinkContext
from fanout.errors import SchemaMismatchError
from fanout.partitioned.membership import MemberDigest

SCHEMA = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("amount", T.LongType()),
        T.StructField("qty", T.IntegerType()),
        T.StructField("at", T.TimestampType()),
    ]
)


class _Hooks:
    def before(self, partition: int, rows: int, written: int) -> None:
        pass

    def after(self, partition: int, rows: int, written: int) -> None:
        pass


def _sink(url: str, **options: Any) -> PostgresSink:
    sink = PostgresSink("pg", url=url, table="t", **options)
    sink.open(SinkContext("altered"))
    return sink


def _writer(sink: PostgresSink, batch_id: int) -> PostgresPartitionWriter:
    plan = write_plan(sink, SCHEMA, batch_id)
    return PostgresPartitionWriter(sink.connection_url(), plan, BatchMeta("altered", batch_id, "q"))


def _write(writer: PostgresPartitionWriter, ids: list[int]) -> Any:
    rows = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "amount": pa.array([100 + i for i in ids], pa.int64()),
            "qty": pa.array([5] * len(ids), pa.int32()),
            "at": pa.array([0] * len(ids), pa.timestamp("us", tz="UTC")),
        }
    )
    # a batch of its own (append: a partition written once per batch)
    writer = dataclasses.replace(writer, meta=BatchMeta("altered", ids[0], "q"))
    return writer.write_partition(0, iter(rows.to_batches()), _Hooks(), MemberDigest())


def _stored(url: str) -> list[tuple[Any, ...]]:
    return query(url, "SELECT id, amount::text, qty::text FROM t ORDER BY id")


@pytest.fixture
def table(pg_url: str) -> str:
    execute(
        pg_url,
        "CREATE TABLE t (id bigint PRIMARY KEY, amount bigint, qty integer, at timestamp)",
    )
    return pg_url


@pytest.mark.parametrize("mode", ["upsert", "append"])
def test_a_plan_gone_stale_within_a_batch_writes_nothing(table: str, mode: str) -> None:
    url = table
    writer = _writer(_sink(url, mode=mode), 0)  # planned on bigint, integer, timestamp
    assert _write(writer, [1]).status == "committed"
    # append: a binary COPY straight into the table, bigint fields read as double
    execute(url, "ALTER TABLE t ALTER COLUMN amount TYPE double precision")
    out = _write(writer, [2])  # the same plan: encoded for bigint
    assert out.status == "failed"
    assert out.failure.kind == "transient"  # retried, under a plan made anew
    assert out.failure.message == (
        "TransientSinkError: sink 'pg', batch 2: table t changed while the batch was "
        "written: amount bigint is now double precision; nothing of this partition was "
        "written, and the batch is retried under a plan made for the table as it is now"
    )
    assert _stored(url) == [(1, "101", "5")]
    execute(url, "ALTER TABLE t ALTER COLUMN qty TYPE bigint, ALTER COLUMN at TYPE bigint USING 0")
    out = _write(writer, [3])
    assert out.status == "failed"
    assert out.failure.kind == "fatal"  # no cast from the staged timestamp: the INSERT fails
    assert 'column "at" is of type bigint but expression is of type timestamp' in (
        out.failure.message
    )
    assert "changed type while the batch was written" in out.failure.message
    assert _stored(url) == [(1, "101", "5")]


def test_each_batch_plans_anew_when_the_table_changed(table: str) -> None:
    url = table
    sink = _sink(url)
    assert _write(_writer(sink, 0), [1]).status == "committed"
    planned = write_plan(sink, SCHEMA, 0)
    assert write_plan(sink, SCHEMA, 1) is planned  # unchanged: the cached plan
    execute(url, "ALTER TABLE t ALTER COLUMN qty TYPE bigint")
    # a batch's preflight (its first step on the driver) finds the change: the plan goes
    frame = SimpleNamespace(schema=SCHEMA)
    sink.preflight(Batch(frame, BatchInfo("altered", 2, "q"), "pg", "fanout/altered/pg"))
    assert SCHEMA.json() not in sink._write_plans.plans
    writer = _writer(sink, 2)
    assert writer.plan is not planned
    assert writer.plan.wire_kinds == ("int8", "int8", "int8", "timestamp")
    assert _write(writer, [2]).status == "committed"
    assert _stored(url) == [(1, "101", "5"), (2, "102", "5")]
    # a change the batch no longer fits is refused as at its first arrival
    execute(url, "ALTER TABLE t ALTER COLUMN amount TYPE double precision")
    with pytest.raises(SchemaMismatchError) as refused:
        write_plan(sink, SCHEMA, 3)
    assert str(refused.value).startswith(
        "sink 'pg', batch 3: batch column 'amount' (bigint) cannot be written to column "
        "amount of table t (DOUBLE PRECISION) without loss"
    )
    execute(
        url,
        "ALTER TABLE t ALTER COLUMN amount TYPE bigint, ALTER COLUMN at TYPE bigint USING 0",
    )
    with pytest.raises(SchemaMismatchError) as refused:
        write_plan(sink, SCHEMA, 4)
    assert "batch column 'at' (timestamp) cannot be written to column at of table t" in str(
        refused.value
    )


def test_a_protocol_violation_is_not_retried() -> None:
    class _Error(Exception):
        pgcode = "08P01"

    assert classify(_Error("insufficient data left in message")) == "fatal"


def test_a_rule_made_while_the_stream_runs_refuses_the_next_batch(table: str) -> None:
    url = table
    sink = _sink(url)
    assert _write(_writer(sink, 0), [1]).status == "committed"
    execute(
        url,
        "CREATE TABLE audit (id bigint)",
        "CREATE RULE t_audit AS ON INSERT TO t DO ALSO INSERT INTO audit VALUES (NEW.id)",
    )
    with pytest.raises(SchemaMismatchError) as refused:
        write_plan(sink, SCHEMA, 1)
    assert str(refused.value) == (
        "sink 'pg', batch 1: the table has rule(s) t_audit (ON INSERT): the sink writes with "
        "COPY, which fires no rule, and falls back to INSERT, which does, so whether a rule "
        "ran would depend on the rows; replace the rule(s) with a trigger, which COPY fires "
        "too"
    )
    execute(url, "DROP RULE t_audit ON t")
    assert _write(_writer(sink, 2), [2]).status == "committed"
    assert _stored(url) == [(1, "101", "5"), (2, "102", "5")]
    assert query(url, "SELECT count(*) FROM audit") == [(0,)]


class _Counted:
    """Counts the sink's partition inputs and reads of its committed partitions."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        made_input, read = PostgresSink.partition_input, PostgresSink.committed_partitions

        def partition_input(sink: PostgresSink, batch: Batch) -> Any:
            self.calls.append("input")
            return made_input(sink, batch)

        def committed_partitions(sink: PostgresSink, batch: Batch, plan: Any) -> Any:
            self.calls.append("read")
            return read(sink, batch, plan)

        monkeypatch.setattr(PostgresSink, "partition_input", partition_input)
        monkeypatch.setattr(PostgresSink, "committed_partitions", committed_partitions)


@pytest.mark.parametrize("altered", [False, True])
def test_the_write_takes_check_replays_input_unless_the_table_changed_in_between(
    table: str, spark: Any, monkeypatch: pytest.MonkeyPatch, altered: bool
) -> None:
    """Append: the kit's ``check_replay`` makes the partition input and reads the progress
    marks, and the write of the same attempt takes them; a table altered in between (the
    write's preflight drops the plan) makes the write plan, make its input and read anew."""
    url, counted = table, _Counted(monkeypatch)
    sink = _sink(url, mode="append", keys=["id"])
    df = spark.createDataFrame([(1, 101, 5, None)], SCHEMA)
    batch = Batch(df, BatchInfo("altered", 0, "q"), "pg", "fanout/altered/pg")
    sink.check_replay(batch)
    if altered:
        execute(url, "ALTER TABLE t ALTER COLUMN qty TYPE bigint")
    prepared = sink.prepare_partitions(batch)
    assert counted.calls == ["input", "read"] * (2 if altered else 1)
    qty = "int8" if altered else "int4"
    assert prepared.task.writer.plan.wire_kinds == ("int8", "int8", qty, "timestamp")


def test_a_pickled_sink_carries_its_write_plans_and_not_its_engine(table: str) -> None:
    """The sink is pickled to the executors: its write plans go with it (the plan, the
    table's columns it was made on, the batch it was checked at), the driver's engine not;
    unpickled, the plan of the batch it was checked at is the cached one, the table not
    read (no engine made)."""
    sink = _sink(table)
    planned = write_plan(sink, SCHEMA, 0)
    back = pickle.loads(pickle.dumps(sink))
    key = SCHEMA.json()
    assert back._write_plans.plans == {key: planned}
    assert back._write_plans.checked == {key: 0}
    assert [row[:3] for row in back._write_plans.shapes[key]] == [
        ("id", "bigint", True),
        ("amount", "bigint", False),
        ("qty", "integer", False),
        ("at", "timestamp without time zone", False),
    ]
    assert back._write_plans.shapes == sink._write_plans.shapes
    assert back._write_plans.unmade is False
    assert "_driver_engine" in sink.__dict__ and "_driver_engine" not in back.__dict__
    assert write_plan(back, SCHEMA, 0) == planned
    assert "_driver_engine" not in back.__dict__


def test_a_sink_pickled_before_its_first_write_still_creates_the_missing_table(
    pg_url: str,
) -> None:
    """``open()`` found the table missing (``create_table``): pickled before any plan, the
    sink still creates it at its first plan, once; dropped after, it is not made again."""
    sink = _sink(pg_url, create_table=True, keys=["id"])
    back = pickle.loads(pickle.dumps(sink))
    assert (back._write_plans.plans, back._write_plans.unmade) == ({}, True)
    assert query(pg_url, "SELECT to_regclass('public.t')::text") == [(None,)]
    plan = write_plan(back, SCHEMA, 0)
    assert plan.columns == (("id", "id"), ("amount", "amount"), ("qty", "qty"), ("at", "at"))
    assert query(pg_url, "SELECT to_regclass('public.t')::text") == [("t",)]
    assert back._write_plans.unmade is False
    execute(pg_url, "DROP TABLE t")
    with pytest.raises(SchemaMismatchError) as refused:
        write_plan(back, SCHEMA, 1)
    assert "table t does not exist: dropped while the run wrote it?" in str(refused.value)
    assert query(pg_url, "SELECT to_regclass('public.t')::text") == [(None,)]
