"""Upsert keys and columns compared by a nondeterministic collation (ICU, ``deterministic =
false``): PostgreSQL's ``=`` calls ``'Bob'`` and ``'bob'`` equal there, as ``citext``'s does,
by the collation's own rules (case, accents, punctuation...), which no fold can follow.

Up to this version the sink did not look at collations: a key's spellings were hashed to
different partitions and the transaction committing last won, whatever ``order_by`` said;
an update changing only a value's case was skipped as a no-op (the no-op check compared the
text under the column's collation); and rows tied on ``order_by`` went to whichever spelling
came first.

These tests need a server built with ICU: only ICU makes nondeterministic collations
(``CREATE COLLATION ... deterministic = false``). The embedded PostgreSQL the tests and CI
run is built without it, so there they skip (``icu_url``); they run against a server with
ICU. What covers the same decisions in CI: :mod:`test_collation_decisions` (no server: the
refusal with ``partitions`` above 1, the ``COLLATE "C"`` of ties and of the no-op check,
the refused unique index, from reflected metadata) and :mod:`test_collation_catalog` (the
embedded server: the catalog queries reflecting them, a collation marked nondeterministic
in the test database's catalog)."""

from __future__ import annotations

from typing import Any

import psycopg2
import pytest
from fanout_postgres import PostgresSink
from pgcheck import execute, query

from fanout.contract.batch import Batch, BatchInfo
from fanout.contract.sink import SinkContext
from fanout.errors import SchemaMismatchError

COLLATION = (
    "CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)"
)
KEYS = 24


@pytest.fixture
def icu_url(pg_url: str) -> str:
    """``pg_url`` with the case-insensitive collation ``ci``; skips without ICU."""
    try:
        execute(pg_url, COLLATION)
    except psycopg2.Error as exc:
        pytest.skip(f"the server has no nondeterministic ICU collation: {exc}".strip())
    return pg_url


def _upsert(spark: Any, url: str, table: str, rows: list[tuple[Any, ...]], schema: str,
            batch_id: int = 0, partitions: int = 8, **options: Any) -> None:  # fmt: skip
    sink = PostgresSink(
        "pg", url=url, table=table, order_by="seq", partitions=partitions, **options
    )
    sink.open(SinkContext("ci"))
    try:
        df = spark.createDataFrame(rows, schema).repartition(3)
        sink.write(Batch(df, BatchInfo("ci", batch_id, "q"), "pg", "fanout/ci/pg"))
    finally:
        sink.close()


def test_a_key_under_a_nondeterministic_collation_is_refused_unless_one_partition(
    spark: Any, icu_url: str
) -> None:
    execute(icu_url, "CREATE TABLE users (email text COLLATE ci PRIMARY KEY, seq bigint NOT NULL)")
    words = [(f"User{n}@X.com", f"user{n}@x.COM", f"USER{n}@X.COM") for n in range(KEYS)]
    rows = []
    for n, (first, winner, last) in enumerate(words):
        rows += [(first, 3 * n + 1), (winner, 3 * n + 3), (last, 3 * n + 2)]
    with pytest.raises(SchemaMismatchError) as caught:
        _upsert(spark, icu_url, "users", rows, "email string, seq bigint")

    assert str(caught.value) == (
        "sink 'pg', batch 0: key column 'email' (string) is written to column email of table "
        "users (TEXT COLLATE ci), which reads the values its nondeterministic collation ci "
        "calls equal (differing in case or accents, as the collation says) as one key; Spark "
        "would hash them to different partitions, whose transactions commit in any order, so "
        "the last would win whatever order_by says; write it as one partition (option "
        "partitions: 1)"
    )
    assert query(icu_url, "SELECT count(*) FROM users") == [(0,)]

    _upsert(spark, icu_url, "users", rows, "email string, seq bigint", partitions=1)
    stored = query(icu_url, "SELECT email::text, seq FROM users ORDER BY seq")
    assert stored == [(winner, 3 * n + 3) for n, (_, winner, _) in enumerate(words)]


def test_a_unique_index_on_the_keys_under_another_collation_is_refused(
    spark: Any, icu_url: str
) -> None:
    """The index calls 'a' and 'A' one key, the column's collation two: the batch's choice
    of a winner kept both, and every attempt failed on a key held twice (named ``{}``)."""
    execute(
        icu_url,
        "CREATE TABLE tags (tag text NOT NULL, seq bigint NOT NULL)",
        "CREATE UNIQUE INDEX tags_tag ON tags (tag COLLATE ci)",
    )
    for partitions in (1, 8):
        with pytest.raises(SchemaMismatchError) as caught:
            sink = PostgresSink(
                "pg", url=icu_url, table="tags", keys=["tag"], order_by="seq",
                partitions=partitions,
            )  # fmt: skip
            sink.open(SinkContext("ci"))
            try:
                df = spark.createDataFrame([("a", 1), ("A", 2)], "tag string, seq bigint")
                sink.write(Batch(df, BatchInfo("ci", 0, "q"), "pg", "fanout/ci/pg"))
            finally:
                sink.close()
        assert str(caught.value) == (
            "sink 'pg', batch 0: the unique index on the keys (tag) of table tags "
            "compares column tag by the nondeterministic collation ci, not by the column's "
            "own collation: the sink chooses each key's row by the column's, and the index "
            "would call two of them one key; give the column that collation (ALTER TABLE ... "
            "ALTER COLUMN tag TYPE ... COLLATE ci)"
        )
    assert query(icu_url, "SELECT count(*) FROM tags") == [(0,)]

    # with the column's collation the index's, the batch's winner is order_by's
    execute(icu_url, "ALTER TABLE tags ALTER COLUMN tag TYPE text COLLATE ci")
    _upsert(spark, icu_url, "tags", [("a", 1), ("A", 2)], "tag string, seq bigint", 0, 1,
            keys=["tag"])  # fmt: skip
    assert query(icu_url, "SELECT tag::text, seq FROM tags") == [("A", 2)]


def test_a_change_of_case_under_a_nondeterministic_collation_is_written(
    spark: Any, icu_url: str
) -> None:
    execute(
        icu_url, "CREATE TABLE people (id bigint PRIMARY KEY, name text COLLATE ci, seq bigint)"
    )
    schema = "id bigint, name string, seq bigint"
    _upsert(spark, icu_url, "people", [(1, "Bob", 1), (2, "ann", 1)], schema, 0)
    _upsert(spark, icu_url, "people", [(1, "bob", 1), (2, "ANN", 1)], schema, 1)

    assert query(icu_url, "SELECT id, name::text, seq FROM people ORDER BY id") == [
        (1, "bob", 1),
        (2, "ANN", 1),
    ]


def test_rows_tied_on_order_by_go_to_the_greatest_spelling(spark: Any, icu_url: str) -> None:
    execute(icu_url, "CREATE TABLE codes (code text COLLATE ci PRIMARY KEY, seq bigint)")
    rows = [("abc", 1), ("ABC", 1), ("Abc", 1), ("xy", 1), ("XY", 1)]
    for order in (rows, rows[::-1]):  # whatever the arrival order
        execute(icu_url, "TRUNCATE codes")
        _upsert(spark, icu_url, "codes", order, "code string, seq bigint", partitions=1)
        # byte order: lowercase letters are greater than capitals
        assert query(icu_url, "SELECT code::text FROM codes ORDER BY 1") == [("abc",), ("xy",)]
