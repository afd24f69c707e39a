"""A Spark string may hold bytes that are not UTF-8 (``CAST(binary AS STRING)``, the text
source), which PostgreSQL refuses (SQLSTATE 22021) and Python cannot decode. Such a row is
refused like any other: it goes to the dead-letter target, or fails the batch naming the
column, the value (its invalid bytes as ``\\xff``) and the row. It failed the partition at
every attempt with a bare ``UnicodeDecodeError`` naming nothing, ``dead_letter`` or not.

Driven through the partition writer (a real plan from a real server, Arrow rows, no Spark).
"""

from __future__ import annotations

from typing import Any

import numpy as np
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

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("s", T.StringType())])
ROW = '{"id": 2, "s": "a\\\\xffb"}'
ROW_JSONB = '{"s": "a\\\\xffb", "id": 2}'  # jsonb orders keys shortest first
REASON = 'invalid byte sequence for encoding "UTF8": 0xff'


def _strings(values: list[bytes]) -> pa.Array:
    """A string array holding these bytes as they are (Arrow does not check them)."""
    offsets = np.cumsum([0] + [len(v) for v in values], dtype=np.int32)
    buffers = [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(values))]
    return pa.Array.from_buffers(pa.string(), len(values), buffers)


def _write(url: str, mode: str, **options: Any) -> PartitionOutcome:
    sink = open_sink(PostgresSink("pg", url=url, table="t", mode=mode, **options), "u8")
    writer = PostgresPartitionWriter(sink.connection_url(), write_plan(sink, SCHEMA, 0),
                                     BatchMeta("u8", 0, "q"), mode == "upsert", 0.0)  # fmt: skip
    rows = pa.table({"id": pa.array([1, 2], pa.int64()), "s": _strings([b"ok", b"a\xffb"])})
    hooks = CommitHooks("u8", "pg", 0)
    return writer.write_partition(0, iter(rows.to_batches()), hooks, MemberDigest())


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_string_that_is_not_utf8_is_dead_lettered(pg_url: str, mode: str) -> None:
    execute(pg_url, "CREATE TABLE t (id bigint PRIMARY KEY, s text)")
    outcome = _write(pg_url, mode, dead_letter="postgres:rejects")
    assert (outcome.status, outcome.rows, outcome.dead_lettered) == ("committed", 1, 1), outcome
    assert query(pg_url, "SELECT id, s FROM t") == [(1, "ok")]
    letters = query(pg_url, "SELECT column_name, value, row::text, reason FROM rejects")
    assert letters == [("s", "a\\xffb", ROW_JSONB, REASON)]


def test_a_string_that_is_not_utf8_fails_the_batch_naming_column_and_value(pg_url: str) -> None:
    execute(pg_url, "CREATE TABLE t (id bigint PRIMARY KEY, s text)")
    outcome = _write(pg_url, "upsert")
    assert outcome.status == "failed" and outcome.failure is not None
    assert (outcome.failure.kind, outcome.failure.message) == ("data", REASON)
    detail = outcome.failure.details
    assert (detail["column"], detail["value"], detail["row"]) == ("s", "a\\xffb", ROW)
    assert query(pg_url, "SELECT count(*) FROM t") == [(0,)]


def _nested(kind: str) -> tuple[T.DataType, pa.Array]:
    """Rows 1 (valid) and 2 (``a\\xffb`` inside) of a nested column of ``kind``."""
    strings = _strings([b"ok", b"a\xffb"])
    if kind == "struct":
        spark = T.StructType([T.StructField("s", T.StringType())])
        return spark, pa.StructArray.from_arrays([strings], names=["s"])
    if kind == "array":
        return T.ArrayType(T.StringType()), pa.ListArray.from_arrays(pa.array([0, 1, 2]), strings)
    keys = pa.array(["k", "l"])
    spark = T.MapType(T.StringType(), T.StringType())
    return spark, pa.MapArray.from_arrays(pa.array([0, 1, 2], pa.int32()), keys, strings)


def _write_nested(url: str, mode: str, kind: str, **options: Any) -> PartitionOutcome:
    spark, values = _nested(kind)
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("n", spark)])
    sink = open_sink(PostgresSink("pg", url=url, table="t", mode=mode, **options), "u8")
    writer = PostgresPartitionWriter(sink.connection_url(), write_plan(sink, schema, 0),
                                     BatchMeta("u8", 0, "q"), mode == "upsert", 0.0)  # fmt: skip
    rows = pa.table({"id": pa.array([1, 2], pa.int64()), "n": values})
    hooks = CommitHooks("u8", "pg", 0)
    return writer.write_partition(0, iter(rows.to_batches()), hooks, MemberDigest())


NESTED = {
    "struct": ({"s": "ok"}, '{"s": "a\\\\xffb"}', {"s": "a\\xffb"}),
    "array": (["ok"], '["a\\\\xffb"]', ["a\\xffb"]),
    "map": ({"k": "ok"}, '{"l": "a\\\\xffb"}', {"l": "a\\xffb"}),
}


@pytest.mark.parametrize("kind", list(NESTED))
@pytest.mark.parametrize("mode", ["append", "upsert", "upsert by order"])
def test_a_nested_string_that_is_not_utf8_is_dead_lettered(
    pg_url: str, mode: str, kind: str
) -> None:
    """Inside a struct, an array or a map the string stopped the JSON encoding with a bare
    ``UnicodeDecodeError``: now the row is refused as a top-level one is, its letter's
    value and row holding the string with ``\\xff`` (upsert with ``order_by``: staged
    with the value as NULL to compete for its key, as a too long one is)."""
    execute(pg_url, "CREATE TABLE t (id bigint PRIMARY KEY, n jsonb)")
    ordered = {"order_by": ["id"]} if mode == "upsert by order" else {}
    outcome = _write_nested(pg_url, mode.split()[0], kind, dead_letter="postgres:rejects",
                            **ordered)  # fmt: skip
    assert (outcome.status, outcome.rows, outcome.dead_lettered) == ("committed", 1, 1), outcome
    good, value, bad = NESTED[kind]
    assert query(pg_url, "SELECT id, n FROM t") == [(1, good)]
    letters = query(pg_url, "SELECT column_name, value, row, reason FROM rejects")
    assert letters == [("n", value, {"id": 2, "n": bad}, REASON)]


def test_a_nested_string_that_is_not_utf8_fails_the_batch_naming_column_and_value(
    pg_url: str,
) -> None:
    execute(pg_url, "CREATE TABLE t (id bigint PRIMARY KEY, n jsonb)")
    outcome = _write_nested(pg_url, "append", "struct")
    assert outcome.status == "failed" and outcome.failure is not None
    assert (outcome.failure.kind, outcome.failure.message) == ("data", REASON)
    detail = outcome.failure.details
    assert (detail["column"], detail["value"]) == ("n", '{"s": "a\\\\xffb"}')
    assert detail["row"] == '{"id": 2, "n": {"s": "a\\\\xffb"}}'
    assert query(pg_url, "SELECT count(*) FROM t") == [(0,)]
