"""A database whose encoding is not UTF-8 (LATIN1): every connection says its text is UTF-8
(``client_encoding``), so the server converts it; a character the database cannot hold
is a refused row naming its column and value, never bytes stored as another encoding's."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg2
import pyarrow as pa
import pytest
from fanout_postgres import EmbeddedPostgres, PostgresSink
from fanout_postgres.failures import batch_error
from fanout_postgres.task import PostgresPartitionWriter
from fanout_postgres.transaction import BatchMeta
from pgcheck import dsn, execute, query
from pyspark.sql import types as T
from write_plan import write_plan

from fanout.contract.sink import SinkContext
from fanout.partitioned.membership import MemberDigest


class _Hooks:
    def before(self, partition: int, rows: int, written: int) -> None:
        pass

    def after(self, partition: int, rows: int, written: int) -> None:
        pass


@pytest.fixture
def latin1_url(pg_server: EmbeddedPostgres, pg_url: str) -> str:
    name = f"latin1_{uuid.uuid4().hex[:8]}"
    conn = psycopg2.connect(dsn(pg_url))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(
            f"CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' "
            "TEMPLATE template0"
        )
    conn.close()
    url = pg_server.url_for(name)
    # numeric takes no binary COPY: table c's rows travel as CSV
    execute(
        url,
        "CREATE TABLE b (id bigint PRIMARY KEY, name text)",
        "CREATE TABLE c (id bigint PRIMARY KEY, name text, n numeric)",
    )
    return url


def _write(url: str, table: str, rows: pa.Table) -> Any:
    schema = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField("name", T.StringType())]
        + ([T.StructField("n", T.StringType())] if "n" in rows.column_names else [])
    )
    sink = PostgresSink("pg", url=url, table=table)
    sink.open(SinkContext("encoding"))
    writer = PostgresPartitionWriter(
        sink.connection_url(), write_plan(sink, schema, 0), BatchMeta("encoding", 0, "q")
    )
    return writer.write_partition(0, iter(rows.to_batches()), _Hooks(), MemberDigest())


def _stored(url: str, table: str) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(dsn(url))
    conn.set_client_encoding("UTF8")
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT id, name, length(name) FROM {table} ORDER BY id")
            return list(cur.fetchall())
    finally:
        conn.close()


@pytest.mark.parametrize("table", ["b", "c"])
def test_text_is_converted_to_the_database_encoding(latin1_url: str, table: str) -> None:
    assert query(latin1_url, "SHOW server_encoding") == [("LATIN1",)]
    rows = pa.table({"id": pa.array([1], pa.int64()), "name": ["José ÿ"]})
    if table == "c":
        rows = rows.append_column("n", pa.array(["1"]))
    assert _write(latin1_url, table, rows).status == "committed"
    assert _stored(latin1_url, table) == [(1, "José ÿ", 6)]


@pytest.mark.parametrize("table", ["b", "c"])
def test_a_character_the_database_cannot_hold_is_a_refused_row(latin1_url: str, table: str) -> None:
    rows = pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["José", "5 €"]})
    if table == "c":
        rows = rows.append_column("n", pa.array(["1", "2"]))
    out = _write(latin1_url, table, rows)
    assert out.status == "failed"
    assert out.failure.kind == "data"
    assert out.failure.details["sqlstate"] == "22P05"
    assert out.failure.details["column"] == "name"
    assert out.failure.details["value"] == "5 €"
    error = batch_error(table, [out], (), "pg", 0)
    assert str(error).startswith(
        f"sink 'pg', batch 0: table {table}, column 'name', value '5 €': character with "
        'byte sequence 0xe2 0x82 0xac in encoding "UTF8" has no equivalent in encoding '
        '"LATIN1"; row {"id": 2, "name": "5 €"'  # the row as its dead letter holds it
    )
    assert _stored(latin1_url, table) == []
