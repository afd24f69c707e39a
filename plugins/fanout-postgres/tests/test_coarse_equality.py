"""Upserts into columns whose type's ``=`` is coarser than what the column stores.

``1.0 = 1.000`` in an unconstrained ``numeric`` (which keeps the scale it is given),
``-0 = 0`` in ``double precision``, ``'bob' = 'Bob'`` in ``citext``, ``'1 day' = '24 hours'``
in ``interval``, ``{"a": 1.0} = {"a": 1.00}`` in ``jsonb``: an update between such values
changes the stored text, so it is written (the no-op check compares them as text, in the
``MERGE`` and in the ``INSERT ... ON CONFLICT``), and a batch holding two such rows of one
key keeps the same one whatever their arrival order (the greatest text wins).

Driven through the partition writer (a real plan from a real server, Arrow rows built here
in their arrival order, no Spark).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from fanout_postgres import PostgresSink
from fanout_postgres.task import PostgresPartitionWriter
from fanout_postgres.transaction import BatchMeta
from pgcheck import execute, query
from pyspark.sql import types as T
from write_plan import write_plan

from fanout.partitioned.membership import MemberDigest
from fanout.partitioned.task import CommitHooks
from fanout.testing import open_sink


def _writer(url: str, table: str, schema: T.StructType, **options: Any) -> Any:
    """The partition writer of ``table`` for batches of ``schema``, as an executor runs it."""
    sink = open_sink(PostgresSink("pg", url=url, table=table, **options), "coarse")
    plan = write_plan(sink, schema, 0)
    return PostgresPartitionWriter(
        sink.connection_url(), plan, BatchMeta("coarse", 0, "q"), False, 0.0
    )


def _write(writer: Any, rows: pa.Table) -> int:
    """Write one partition; the number of rows it inserted or changed."""
    hooks = CommitHooks("coarse", "pg", 0)
    outcome = writer.write_partition(0, iter(rows.to_batches()), hooks, MemberDigest())
    assert outcome.status == "committed", outcome.failure
    return int(outcome.counters["changed"])


# column type -> (Spark type of the batch column, Arrow type, first value, second value
# (equal to the first by the type's =), each value's stored text)
CHANGES: dict[str, tuple[Any, Any, Any, Any, str, str]] = {
    "citext": (T.StringType(), pa.string(), "bob@x.com", "Bob@x.com", "bob@x.com", "Bob@x.com"),
    "numeric": (T.StringType(), pa.string(), "1.0", "1.000", "1.0", "1.000"),
    # a double goes by binary COPY (every column of the table has a binary form)
    "double precision": (T.DoubleType(), pa.float64(), 0.0, -0.0, "0", "-0"),
    "interval": (T.StringType(), pa.string(), "1 day", "24 hours", "1 day", "24:00:00"),
    "jsonb": (T.StringType(), pa.string(), '{"a": 1.0}', '{"a": 1.00}', '{"a": 1.0}',
              '{"a": 1.00}'),
    "citext[]": (T.StringType(), pa.string(), "{bob}", "{Bob}", "{bob}", "{Bob}"),
    "amount": (T.StringType(), pa.string(), "2.50", "2.5", "2.50", "2.5"),  # numeric domain
}  # fmt: skip


@pytest.mark.parametrize("pg_type", sorted(CHANGES))
@pytest.mark.parametrize("statement", ["merge", "on conflict"])
def test_an_update_only_its_text_shows_is_written(
    pg_url: str, pg_type: str, statement: str
) -> None:
    spark_type, arrow_type, first, second, first_text, second_text = CHANGES[pg_type]
    execute(
        pg_url,
        "CREATE EXTENSION IF NOT EXISTS citext",
        "CREATE DOMAIN amount AS numeric",
        f"CREATE TABLE docs (id bigint PRIMARY KEY, v {pg_type}, ver bigint)",
    )
    schema = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField("v", spark_type),
         T.StructField("ver", T.LongType())]
    )  # fmt: skip
    writer = _writer(pg_url, "docs", schema, order_by="ver")

    def write(value: Any) -> int:
        # merge: one row of the key (MERGE); on conflict: the key twice, an older version
        # losing (DISTINCT ON, then INSERT ... ON CONFLICT)
        rows = [(1, value, 5)] if statement == "merge" else [(1, value, 5), (1, None, 4)]
        ids, values, versions = zip(*rows, strict=True)
        return _write(
            writer,
            pa.table(
                {
                    "id": pa.array(ids, pa.int64()),
                    "v": pa.array(values, arrow_type),
                    "ver": pa.array(versions, pa.int64()),
                }
            ),
        )

    def stored() -> list[tuple[Any, ...]]:
        return query(pg_url, "SELECT id, v::text, ver FROM docs")

    assert write(first) == 1
    assert stored() == [(1, first_text, 5)]
    assert write(second) == 1  # equal by the type's =, yet another stored text
    assert stored() == [(1, second_text, 5)]
    assert write(second) == 0  # a true no-op is still skipped
    assert stored() == [(1, second_text, 5)]


# rows of one key tied on the numeric version (2 = 2.0 = 2.00), and on the numeric amount
# (1.0 = 1.00): the greatest text of each column whose = is coarse decides, in table order
TIED = [
    (7, "a", "1.0", "2"),
    (7, "a", "1.00", "2"),  # the winner: '1.00' > '1.0'
    (8, "b", "1.0", "2.0"),
    (8, "b", "1.0", "2.00"),  # the winner: '2.00' > '2.0'
]


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "backward"])
def test_a_tie_under_coarse_equality_has_one_winner_in_any_arrival_order(
    pg_url: str, reverse: bool
) -> None:
    execute(
        pg_url,
        "CREATE TABLE orders (id bigint PRIMARY KEY, customer text, amount numeric, "
        "version numeric)",
    )
    schema = T.StructType([T.StructField("id", T.LongType())] + [
        T.StructField(c, T.StringType()) for c in ("customer", "amount", "version")
    ])  # fmt: skip
    rows = TIED[::-1] if reverse else TIED
    ids, customers, amounts, versions = zip(*rows, strict=True)
    table = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "customer": list(customers),
            "amount": list(amounts),
            "version": list(versions),
        }
    )
    assert _write(_writer(pg_url, "orders", schema, order_by="version"), table) == 2
    stored = query(
        pg_url, "SELECT id, customer, amount::text, version::text FROM orders ORDER BY id"
    )
    # key 7: the amount's text decides ('1.00' > '1.0'); key 8: the version's ('2.00')
    assert stored == [(7, "a", "1.00", "2"), (8, "b", "1.0", "2.00")]


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "backward"])
def test_which_spelling_of_a_citext_key_is_written_does_not_depend_on_arrival_order(
    pg_url: str, reverse: bool
) -> None:
    execute(
        pg_url,
        "CREATE EXTENSION IF NOT EXISTS citext",
        "CREATE TABLE users (email citext PRIMARY KEY, name text, ver bigint)",
    )
    schema = T.StructType(
        [T.StructField("email", T.StringType()), T.StructField("name", T.StringType()),
         T.StructField("ver", T.LongType())]
    )  # fmt: skip
    # Arrow sees two keys, the server one: the statement without DISTINCT ON raises 21000
    # and the deduplicating one runs
    rows = [("Bob@x.com", "x", 1), ("bob@x.com", "x", 1), ("BOB@x.com", "x", 1)]
    if reverse:
        rows = rows[::-1]
    emails, names, versions = zip(*rows, strict=True)
    table = pa.table(
        {"email": list(emails), "name": list(names), "ver": pa.array(versions, pa.int64())}
    )
    assert _write(_writer(pg_url, "users", schema, order_by="ver"), table) == 1
    # the greatest text in byte order: lower case sorts after upper case
    assert query(pg_url, "SELECT email::text, name, ver FROM users") == [("bob@x.com", "x", 1)]
